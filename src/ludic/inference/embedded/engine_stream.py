"""The handle of one streamed request of the embedded engine (`CompletionStream`), and the
thread-safe hand-off of results from the engine's worker thread to the requester's event loop.
The worker loop and request admission live in `ludic.inference.embedded.engine`; text deltas in
`ludic.inference.embedded.streaming`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ludic.inference.client import ChatResponse
from ludic.inference.embedded.sequence import SequenceState
from ludic.inference.embedded.streaming import CompletionDelta


class CompletionStream:
    """The deltas of one streamed request (`EmbeddedEngine.stream`), for `async for`. The
    worker thread wakes the consumer when tokens arrive or the request ends; several tokens
    arriving between wake-ups go out as one delta. `aclose()` (or leaving the loop early)
    cancels the request unless it has finished, whether or not iteration began."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._wake = asyncio.Event()
        self.finished = False  # set on the loop once the worker is done with the request
        self._seq: SequenceState | None = None
        self._deltas: AsyncGenerator[CompletionDelta, None] | None = None

    def on_token(self, seq: SequenceState) -> None:
        call_on_loop(self._loop, seq, self._wake.set)

    def on_done(self, seq: SequenceState) -> None:
        call_on_loop(self._loop, seq, self._finish)

    def _finish(self) -> None:
        self.finished = True
        self._wake.set()

    def _follow(self, seq: SequenceState) -> None:
        self._seq, self._deltas = seq, self._deltas_of(seq)

    def __aiter__(self) -> CompletionStream:
        return self

    async def __anext__(self) -> CompletionDelta:
        assert self._deltas is not None, "EmbeddedEngine.stream starts the stream"
        return await anext(self._deltas)

    async def aclose(self) -> None:
        if not self.finished and self._seq is not None:
            self._seq.cancelled = True
        if self._deltas is not None:
            await self._deltas.aclose()

    async def _deltas_of(self, seq: SequenceState) -> AsyncGenerator[CompletionDelta, None]:
        sent = 0
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                finished = self.finished
                if finished and seq.error is None:
                    break  # the response's delta below carries the rest
                n = min(len(seq.completion_ids), len(seq.logprobs))  # appended by the worker
                if n > sent:  # a failed request still delivers what it sampled, then raises
                    yield CompletionDelta(
                        token_ids=tuple(seq.completion_ids[sent:n]),
                        logprobs=tuple(seq.logprobs[sent:n]),
                        prompt_token_ids=() if sent else tuple(seq.prompt_ids),
                    )
                    sent = n
                if finished:
                    assert seq.error is not None
                    raise seq.error
            response = seq.to_response()
            yield CompletionDelta(
                token_ids=response.completion_token_ids[sent:],
                logprobs=(response.completion_logprobs or ())[sent:],
                prompt_token_ids=() if sent else response.prompt_token_ids,
                response=response,
            )
        finally:
            if not self.finished:  # the consumer stopped early
                seq.cancelled = True


def call_on_loop(
    loop: asyncio.AbstractEventLoop, seq: SequenceState, fn: Callable[..., None], *args: Any
) -> None:
    """Schedule `fn` on the requester's loop from the worker thread. A loop that has closed
    (its `asyncio.run` returned with the request still running) has nobody left to tell: the
    request is cancelled, and the worker must not die of it."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # "Event loop is closed"
        seq.cancelled = True


def resolve_response(future: asyncio.Future[ChatResponse], seq: SequenceState) -> None:
    if future.done():
        return
    if seq.error is not None:
        future.set_exception(seq.error)
    elif seq.cancelled:
        future.cancel()
    else:
        future.set_result(seq.to_response())
