"""One request never hurts another in the embedded engine: a fault inside a batched step fails
only the request that also fails alone, the others finish with exactly the tokens they would
have had without it, and admission (templating, tokenizing) never runs on the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from engine_fakes import admitted_together

from ludic.inference import ChatRequest, ChatResponse, SamplingConfig
from ludic.inference.embedded import batching, prompts
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.embedded.sequence import SequenceState
from ludic.models import load_tiny_model

BAD_MARK = "<bad-request>"  # a stop string that marks the request the injected faults target


def good(k: int) -> ChatRequest:
    content = "Board: " + "X O " * k
    sampling = SamplingConfig(max_tokens=10, seed=100 + k, extras={"ignore_eos": True})
    return ChatRequest(messages=[{"role": "user", "content": content}], sampling=sampling)


GOOD = [good(k) for k in range(10)]
BAD = ChatRequest(
    messages=[{"role": "user", "content": "Bad."}],
    sampling=SamplingConfig(
        max_tokens=10, seed=7, temperature=0.5, stop=(BAD_MARK,), extras={"ignore_eos": True}
    ),
)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        yield eng


async def together(engine: EmbeddedEngine, requests: list[ChatRequest]) -> list[Any]:
    """One batch; a failed request's exception takes its place."""
    return await admitted_together(engine, requests, return_exceptions=True)


def assert_same(want: list[Any], got: list[Any]) -> None:
    for a, b in zip(want, got, strict=True):
        assert isinstance(a, ChatResponse) and isinstance(b, ChatResponse), (a, b)
        assert a.completion_token_ids == b.completion_token_ids
        assert a.completion_logprobs is not None and b.completion_logprobs is not None
        assert torch.allclose(
            torch.tensor(a.completion_logprobs), torch.tensor(b.completion_logprobs), atol=1e-4
        )


def fault_if(condition: bool) -> None:
    if condition:
        raise RuntimeError("injected fault")


def inject(monkeypatch: pytest.MonkeyPatch, site: str) -> None:
    """A fault that hits every step (batched or alone) holding the bad request, at `site`."""
    if site == "prefill":
        forward = batching.DecodeBatch._forward_prompts

        def prefill(self: Any, new: list[SequenceState], prefixes: list[Any]) -> Any:
            fault_if(any(BAD_MARK in s.stop for s in new))
            return forward(self, new, prefixes)

        monkeypatch.setattr(batching.DecodeBatch, "_forward_prompts", prefill)
    elif site == "sampling":  # where top_k >= 2**63 used to raise: building the rows' knobs
        knobs = batching.RowKnobs.of

        def of(temperatures: list[float], *args: Any) -> Any:
            fault_if(0.5 in temperatures)
            return knobs(temperatures, *args)

        monkeypatch.setattr(batching.RowKnobs, "of", of)
    else:  # recording the sampled token: rows before the bad one have recorded theirs
        append = SequenceState.append

        def record(self: SequenceState, *args: Any, **kwargs: Any) -> None:
            fault_if(BAD_MARK in self.stop)
            append(self, *args, **kwargs)

        monkeypatch.setattr(SequenceState, "append", record)


@pytest.mark.parametrize("site", ["prefill", "sampling", "recording"])
async def test_one_bad_request_among_ten_good_ones_fails_alone(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch, site: str
) -> None:
    reference = await together(engine, GOOD)
    inject(monkeypatch, site)
    results = await together(engine, [*GOOD[:5], BAD, *GOOD[5:]])
    bad = results.pop(5)
    assert isinstance(bad, RuntimeError) and "injected fault" in str(bad)
    assert_same(reference, results)  # the ten succeed, with the tokens they had without it
    status = engine.status()
    assert status.running and status.last_error is not None and "injected" in status.last_error
    monkeypatch.undo()
    assert (await engine.complete(BAD)).finish_reason == "length"


async def test_a_request_past_validation_with_top_k_2_63_fails_alone(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reported case, with the admission check switched off: the shared step overflows
    building the rows' top-k tensor, and only the request that overflows alone fails."""
    reference = await together(engine, GOOD)
    monkeypatch.setattr(SamplingConfig, "validate", lambda self: None)
    huge = ChatRequest(
        messages=[{"role": "user", "content": "k"}], sampling=SamplingConfig(top_k=2**63)
    )
    results = await together(engine, [huge, *GOOD])
    bad = results.pop(0)
    assert isinstance(bad, RuntimeError) and "overflow" in str(bad).lower()
    assert_same(reference, results)


async def test_a_fault_after_the_draw_loses_no_rows_sample(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-off fault after every row drew its uniform: each row is retried alone with the
    uniform it drew, so seeded requests still give their own tokens, and none fails."""
    reference = await together(engine, GOOD)
    sample, faults = batching.sample_tokens, []

    def once(logprobs_BV: torch.Tensor, *args: Any) -> torch.Tensor:
        if len(logprobs_BV) > 1 and not faults:
            faults.append(1)
            raise RuntimeError("injected transient fault")
        return sample(logprobs_BV, *args)

    monkeypatch.setattr(batching, "sample_tokens", once)
    assert_same(reference, await together(engine, GOOD))
    assert faults == [1]


async def test_a_step_that_fails_whenever_rows_share_it_still_finishes_every_request(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not attributable to one row: every batched step fails, so every token comes from a
    retry alone. Slow, but each request finishes with its own tokens; nothing wedges."""
    requests = GOOD[:4]
    reference = await together(engine, requests)
    forward = batching.DecodeBatch._forward

    def shared(self: Any, tokens_B: torch.Tensor) -> None:
        fault_if(len(self.rows) > 1)
        forward(self, tokens_B)

    monkeypatch.setattr(batching.DecodeBatch, "_forward", shared)
    assert_same(reference, await together(engine, requests))


async def test_prompts_are_rendered_off_the_event_loop(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long templating or tokenizing job runs on an admission thread: the event loop stays
    free (here it is what releases the job) and other requests go on being served."""
    render, threads = prompts.render_prompt_ids, []
    started, release = threading.Event(), threading.Event()

    def slow_render(*args: Any, **kwargs: Any) -> list[int]:
        threads.append(threading.current_thread().name)
        if len(threads) == 1:  # the first request's render blocks until the loop frees it
            started.set()
            release.wait(60)
        return render(*args, **kwargs)

    monkeypatch.setattr(prompts, "render_prompt_ids", slow_render)
    slow = asyncio.ensure_future(engine.complete(GOOD[0]))
    await asyncio.to_thread(started.wait, 60)
    other = await asyncio.wait_for(engine.complete(GOOD[1]), 60)  # served meanwhile
    assert not slow.done() and other.finish_reason == "length"
    release.set()
    assert (await asyncio.wait_for(slow, 60)).finish_reason == "length"
    assert all(name.startswith("ludic-admit") for name in threads)


async def test_requests_still_being_admitted_when_the_engine_closes_fail_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some renders running on the admission threads, one queued behind them: closing the
    engine answers every one with "closed", none with a bare cancellation."""
    model, tokenizer = load_tiny_model()
    eng = EmbeddedEngine(model, tokenizer)
    render, release, running = prompts.render_prompt_ids, threading.Event(), []

    def held(*args: Any, **kwargs: Any) -> list[int]:
        running.append(1)
        release.wait(60)
        return render(*args, **kwargs)

    monkeypatch.setattr(prompts, "render_prompt_ids", held)
    tasks = [asyncio.ensure_future(eng.complete(r)) for r in GOOD[:6]]
    while len(running) < 4:  # every admission thread is busy; the others wait in its queue
        await asyncio.sleep(0.01)
    await asyncio.to_thread(eng.close)
    release.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    assert all(isinstance(r, RuntimeError) and "closed" in str(r) for r in results), results
