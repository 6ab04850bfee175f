"""EmbeddedEngine: an in-process ChatClient over a Hugging Face model with continuous batching.

Concurrent `complete()` calls from any event loop are queued to one worker thread that owns the
model, which admits them into a shared batch between decode steps (`ludic.inference.embedded.batching`).
Each response carries the exact prompt ids (the chat template is rendered once, with the
request's tools), the sampled ids, their behaviour logprobs and the policy version. Weight
updates and logprob probes run on the same thread between steps; the next turn of an episode
reuses the KV of the turn before (prefix reuse, cleared on weight updates).

Requests are validated and tokenized on the engine's admission threads, never on the caller's
event loop. A failed batched step fails only the requests that fail when retried alone (each
live request is re-prefilled and stepped by itself); the others continue.

transformers' own continuous batching (`generate_batch` / `init_continuous_batching`) was
evaluated and not used: it samples every request from one global RNG, so per-request seeds are
not reproducible, and it has no per-request stop strings or max_think. `stream()` yields a
request's tokens as they are sampled. This engine does not support n > 1 per request and never
loads weights from a hub.

`EngineConfig` / `EngineStatus` live in `ludic.inference.embedded.engine_config` and the streamed-request
handle `CompletionStream` in `ludic.inference.embedded.engine_stream`; both are re-exported here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.embedded.batching import DecodeBatch
from ludic.inference.embedded.engine_config import EngineConfig, EngineStatus, model_context
from ludic.inference.embedded.engine_stream import CompletionStream, call_on_loop, resolve_response
from ludic.inference.embedded.prompts import build_sequence
from ludic.inference.embedded.sequence import SequenceState, TextCodec
from ludic.inference.template_check import warn_if_not_append_only
from ludic.inference.weights import check_policy_version, copy_weights_

if TYPE_CHECKING:
    from ludic.training.checkpoint_manifest import VerifyMode

T = TypeVar("T")
logger = logging.getLogger(__name__)
_ADMISSION_THREADS = 4


class _Control:
    """A function to run on the worker thread between steps, with its outcome."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:
            self.error = e
        finally:
            self.done.set()


def _check_start_version(version: object) -> None:
    """ValueError unless `version` (the policy version an engine starts at) is an int >= 0, as
    `ludic serve --policy-version` and every push require."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"policy_version must be an int >= 0, got {version!r}")
    if version >= 2**63:
        raise ValueError(f"policy_version must be below 2**63 (an int64), got {version!r}")


class EmbeddedEngine:
    """In-process ChatClient with continuous batching. Close it (or use `with`) when done."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        config: EngineConfig | None = None,
        policy_version: int = 0,
    ) -> None:
        _check_start_version(policy_version)
        self.model = model.eval()
        self.tokenizer = tokenizer
        warn_if_not_append_only(tokenizer)  # once per template; drift splits samples otherwise
        self.config = config or EngineConfig()
        self.codec = TextCodec(tokenizer)
        self.model_len = model_context(model)  # the model's own; max_model_len may cap it
        self.max_model_len = self.config.max_model_len or self.model_len
        self.vocab_size = max(len(tokenizer), int(model.config.vocab_size))
        self.eos_ids = frozenset(self.config.eos_token_ids or _default_eos_ids(model, tokenizer))
        self._version = policy_version
        self._batch = DecodeBatch(
            model,
            self.codec,
            self.config.logprobs_mode,
            self.config.prefix_cache_tokens,
            lean_forward=self.config.lean_forward,
            batch_invariant=self.config.batch_invariant,
            prepacked_gemm=self.config.prepacked_gemm,
        )
        self._pending: deque[SequenceState] = deque()
        self._controls: deque[_Control] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._last_error: str | None = None
        self._cancelled = 0
        self._live: dict[SequenceState, None] = {}  # taken from the queue, not yet resolved
        # The admission threads share `tokenizer` and only read it: no call sets truncation or
        # padding, and TextCodec's encode above already cleared any a tokenizer.json shipped (a
        # fast tokenizer changed while another thread encodes fails, "Already borrowed" on
        # tokenizers < 0.23: huggingface/tokenizers#537; test_engine_shared_tokenizer.py).
        self._admission = ThreadPoolExecutor(_ADMISSION_THREADS, thread_name_prefix="ludic-admit")
        self._thread = threading.Thread(target=self._run, name="ludic-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device = "cpu",
        config: EngineConfig | None = None,
        policy_version: int | None = None,
        verify: VerifyMode = "sha256",
    ) -> EmbeddedEngine:
        """An engine over a local model directory (see `ludic.models.load_model`, which checks a
        training checkpoint's files as `verify` says), at `policy_version`; by default the
        version a training checkpoint's weights were saved at (0 for a plain model directory),
        so what it generates is tagged with the policy that generated it."""
        from ludic.models.loading import load_model, saved_policy_version

        if policy_version is not None:
            _check_start_version(policy_version)  # before the model loads
        model, tokenizer = load_model(path, dtype=dtype, device=device, verify=verify)
        if policy_version is None:
            policy_version = saved_policy_version(path)
        return cls(model, tokenizer, config=config, policy_version=policy_version)

    @property
    def policy_version(self) -> int:
        return self._version

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Generate one completion; raises ValueError on an invalid request."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ChatResponse] = loop.create_future()

        def on_done(seq: SequenceState) -> None:
            call_on_loop(loop, seq, resolve_response, future, seq)

        seq = self._enqueue(await self._build_off_loop(request, on_done=on_done))
        try:
            return await future
        except asyncio.CancelledError:
            seq.cancelled = True
            raise

    def stream(self, request: ChatRequest) -> CompletionStream:
        """Generate one completion, yielding its tokens as they are sampled (call it on an
        event loop). The request is validated and queued at once (ValueError if invalid); the
        last delta carries the same `ChatResponse` that `complete` returns. `aclose()` on the
        stream before its end cancels the request."""
        stream = CompletionStream(asyncio.get_running_loop())
        seq = self._build(request, on_done=stream.on_done, on_token=stream.on_token)
        stream._follow(self._enqueue(seq))
        return stream

    async def open_stream(self, request: ChatRequest) -> CompletionStream:
        """`stream`, with the request validated and tokenized off the event loop (a long prompt
        does not stall the loop); what the server uses."""
        stream = CompletionStream(asyncio.get_running_loop())
        seq = await self._build_off_loop(request, on_done=stream.on_done, on_token=stream.on_token)
        stream._follow(self._enqueue(seq))
        return stream

    def _build(
        self,
        request: ChatRequest,
        *,
        on_done: Callable[[SequenceState], None],
        on_token: Callable[[SequenceState], None] | None = None,
    ) -> SequenceState:
        return build_sequence(
            request,
            tokenizer=self.tokenizer,
            eos_ids=self.eos_ids,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            model_len=self.model_len,
            seed=_seed_or_random(request.sampling.seed),
            on_done=on_done,
            on_token=on_token,
        )

    async def _build_off_loop(
        self,
        request: ChatRequest,
        *,
        on_done: Callable[[SequenceState], None],
        on_token: Callable[[SequenceState], None] | None = None,
    ) -> SequenceState:
        build = functools.partial(self._build, request, on_done=on_done, on_token=on_token)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._admission, build)
        except RuntimeError as e:
            if self._closed:  # the admission threads stopped with the engine
                raise RuntimeError("EmbeddedEngine is closed") from e
            raise
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                raise RuntimeError("EmbeddedEngine is closed") from None  # dropped at close
            raise

    def _enqueue(self, seq: SequenceState) -> SequenceState:
        with self._cv:
            if self._closed:
                raise RuntimeError("EmbeddedEngine is closed")
            self._pending.append(seq)
            self._cv.notify()
        return seq

    def update_weights(
        self,
        weights: Mapping[str, torch.Tensor] | torch.nn.Module,
        *,
        version: int | None = None,
        strict: bool = True,
    ) -> int:
        """Copy `weights` into the served model in place, between decode steps.

        In-flight requests continue with the new weights (their response reports the version
        they started with, and `extra["policy_version_end"]`). Returns the new policy version:
        `version` if given (an int >= 0), else the old one plus one. Blocks until applied.
        Unknown names, wrong shapes and tensors holding a nan or an inf raise ValueError
        (`NonFiniteWeightsError` for those) before any weight is written.
        """
        check_policy_version(version)
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights

        def apply() -> int:
            try:
                copy_weights_(self.model, state, strict=strict)
            finally:  # even a partial copy changed weights
                self._batch.weights_changed()
            self._batch.prefix_cache.clear()  # its KV came from the old weights
            self._version = self._version + 1 if version is None else version
            return self._version

        return self._call_on_worker(apply)

    def update_weights_in_place(
        self, fill: Callable[[torch.nn.Module], None], *, version: int | None = None
    ) -> int:
        """Run `fill(model)` (which writes new values into the served parameters, e.g. by
        receiving a broadcast straight into them) between decode steps, with no staging copy.

        Same semantics as `update_weights`: in-flight requests continue with the new weights,
        the prefix cache is dropped, and the new policy version is returned. Blocks until done.
        Whatever `fill` writes is served as it lands: checking it (e.g. for nan) is the
        caller's, inside `fill`; a `fill` that raises leaves the version as it was and its
        error in `status().last_error`.
        """
        check_policy_version(version)

        def apply() -> int:
            # Before the fill too: what the forward keeps from the old weights (fused views)
            # would pin their storage while a fill lays the parameters out anew.
            self._batch.weights_changed()
            try:
                with torch.no_grad():
                    fill(self.model)
            except Exception as e:  # in `status()` (and /health): what the model may hold now
                self._last_error = f"a weight update in place failed (weights may be new): {e}"
                raise
            finally:  # a fill that failed half-way changed weights too
                self._batch.weights_changed()
            self._batch.prefix_cache.clear()  # its KV came from the old weights
            self._version = self._version + 1 if version is None else version
            return self._version

        return self._call_on_worker(apply)

    def logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """Raw model logprobs of `token_ids[1:]` given their prefixes (a weight-sync probe)."""
        if len(token_ids) > self.max_model_len:
            raise ValueError(
                f"logprobs() takes at most {self.max_model_len} token ids (the model's context), "
                f"got {len(token_ids)}"
            )
        ids = [int(t) for t in token_ids]
        if len(ids) < 2:
            raise ValueError("logprobs() needs at least 2 token ids (a prefix and a target)")
        if not all(0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"logprobs() token ids must lie in [0, {self.vocab_size})")

        @torch.inference_mode()
        def probe() -> list[float]:
            ids_1T = torch.tensor([ids], device=self.model.device)
            logits_TV = self.model(input_ids=ids_1T).logits[0, :-1].float()
            lp_T = torch.log_softmax(logits_TV, -1).gather(-1, ids_1T[0, 1:, None]).squeeze(-1)
            return [float(x) for x in lp_T.tolist()]

        return self._call_on_worker(probe)

    def status(self) -> EngineStatus:
        with self._cv:
            return EngineStatus(
                running=self._thread.is_alive() and not self._closed,
                active=len(self._batch),
                pending=len(self._pending),
                policy_version=self._version,
                last_error=self._last_error,
                prefix_hits=self._batch.prefix_cache.hits,
                cancelled=self._cancelled,
            )

    def close(self) -> None:
        """Stop the worker; requests still queued or running fail with RuntimeError."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._admission.shutdown(wait=False, cancel_futures=True)
        self._thread.join(timeout=30)

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call_on_worker(self, fn: Callable[[], T]) -> T:
        control = _Control(fn)
        with self._cv:
            if self._closed:
                raise RuntimeError("EmbeddedEngine is closed")
            self._controls.append(control)
            self._cv.notify()
        control.done.wait()
        if control.error is not None:
            raise control.error
        result: T = control.result
        return result

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._closed or self._pending or self._controls or len(self._batch)):
                    self._cv.wait()
                if self._closed:
                    break
                controls = list(self._controls)
                self._controls.clear()
                new = self._take_pending()
            for control in controls:
                control.run()
            self._live.update(dict.fromkeys(new))
            try:
                for seq in new:
                    seq.policy_version = self._version
                self._batch.admit(new)
                finished = self._batch.step()
            except Exception as e:  # a failed step fails the requests that caused it
                self._last_error = f"{type(e).__name__}: {e}"
                logger.warning("a batched step failed (%s); retrying each request alone", e)
                finished = self._isolate()
            for seq in finished:
                self._answer(seq)
        self._fail_remaining()

    def _isolate(self) -> list[SequenceState]:
        """After a failed admission or step: step each live request alone (re-prefilled from
        its prompt and completion so far). One that fails alone fails with its own error; the
        others rejoin the batch one token further. Returns the requests to answer."""
        unused = self._batch.unused_uniforms()
        self._batch.reset()
        finished: list[SequenceState] = []
        for seq in list(self._live):
            if not seq.done:
                try:
                    if not self._batch.step_alone(seq, unused.get(seq)):
                        continue
                except Exception as e:
                    seq.error = RuntimeError(f"generation failed: {type(e).__name__}: {e}")
            finished.append(seq)  # including rows that finished in the failed step
        return finished

    def _answer(self, seq: SequenceState) -> None:
        self._live.pop(seq, None)
        self._cancelled += seq.cancelled and seq.finish_reason is None
        seq.policy_version_end = self._version
        if seq.on_done is not None:
            seq.on_done(seq)

    def _take_pending(self) -> list[SequenceState]:
        new: list[SequenceState] = []
        budget = self.config.max_prefill_tokens
        while self._pending and len(self._batch) + len(new) < self.config.max_batch_size:
            seq = self._pending[0]
            if seq.cancelled:  # its requester is gone: nobody to answer
                self._pending.popleft()
                self._cancelled += 1
                continue
            if new and len(seq.prompt_ids) > budget:
                break
            budget -= len(seq.prompt_ids)
            new.append(self._pending.popleft())
        return new

    def _fail_remaining(self) -> None:
        with self._cv:
            self._batch.reset()
            leftovers = list(self._live) + list(self._pending)
            self._pending.clear()
            controls = list(self._controls)
            self._controls.clear()
        for seq in leftovers:
            seq.error = RuntimeError("EmbeddedEngine closed before the request finished")
            self._answer(seq)
        for control in controls:
            control.error = RuntimeError("EmbeddedEngine is closed")
            control.done.set()


def _seed_or_random(seed: int | None) -> int:
    return secrets.randbits(63) if seed is None else seed


def _default_eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(t) for t in source)
    if not ids:
        raise ValueError(
            "cannot tell when to stop: neither the generation config nor the tokenizer names an "
            "eos token; pass EngineConfig(eos_token_ids=(...))"
        )
    return ids


__all__ = ["CompletionStream", "EmbeddedEngine", "EngineConfig", "EngineStatus"]
