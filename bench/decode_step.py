"""Benchmark: where one decode step of the embedded engine spends its time (issue 25's workload).

Runs `bench/rl_step.py`'s generation (the chat prompt "Say something.", 2 prompts x 8 rows of
exactly 64 tokens, fp32, one torch thread) through `DecodeBatch` (the engine's worker loop,
without its threads) and prints JSON, per decode step at that row count, in CPU milliseconds of
this thread (robust to other processes on a shared machine, which wall time is not):

- `step_ms`: one `DecodeBatch.step` (sampling + recording + the next forward), over whole
  generations; `sample_and_record_ms` and `forward_ms` its two parts.
- `*_without_gemm_attention_ms`: the same generations with every GEMM and SDPA call returning
  a stored output without computing (the tokens are then meaningless; every row still runs 64
  steps): what is left is the elementwise ops (norms, rotary, residuals, SiLU, KV writes),
  sampling and the Python around them; `gemm_and_attention_in_place_ms` = the difference.
- `gemm_replayed_alone_ms` / `attention_replayed_alone_ms`: one decode forward's own GEMM and
  SDPA calls (same tensors, layouts and kernels) replayed back to back, with the weights hot in
  cache; less than in place, where the rest of the step evicts them.
- `--compare-prepacked ROUNDS`: instead, per-step CPU ms of today's GEMMs against
  `EngineConfig(prepacked_gemm=True)` (oneDNN on packed weights), interleaved, and how far the
  logprobs move.
- `--forms`: per row count, the down projection's two GEMM forms as the forward's chain lays
  them out (`W @ x.T` on a transposed activation, as today for 2-128 rows, against
  `F.linear`), with whether their results are bit for bit equal.

What it does not do: time the engine's threads, the rollout code or training (`bench/rl_step.py`
does). Run: `python bench/decode_step.py [--model tiny|50m] [--generations 5] [--forms]
[--compare-prepacked 6]`.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _args import positive_int, show_defaults
from rl_step import MODEL_SPECS  # the workload and models of bench/rl_step.py
from trl_side import COMPLETION_TOKENS, GROUP_SIZE, PROMPT_TEXT, PROMPTS

from ludic.inference.client import ChatRequest
from ludic.inference.embedded import lean_forward
from ludic.inference.embedded.batching import DecodeBatch
from ludic.inference.embedded.prompts import build_sequence
from ludic.inference.embedded.sequence import SequenceState, TextCodec
from ludic.inference.sampling import SamplingConfig
from ludic.models import TinyModelSpec, build_tiny_model


class Workload:
    """The rl_step generation on one DecodeBatch; `run()` generates one batch to the end."""

    def __init__(self, model_name: str) -> None:
        spec = TinyModelSpec(**MODEL_SPECS[model_name])
        self.model, self.tokenizer = build_tiny_model(seed=0, spec=spec)
        self.model.float().eval()
        self.batch = DecodeBatch(self.model, TextCodec(self.tokenizer))
        self.seed = 0

    def sequences(self) -> list[SequenceState]:
        sampling = SamplingConfig(max_tokens=COMPLETION_TOKENS, extras={"ignore_eos": True})
        request = ChatRequest(
            messages=[{"role": "user", "content": PROMPT_TEXT}], sampling=sampling
        )
        seqs = []
        for _ in range(PROMPTS * GROUP_SIZE):
            self.seed += 1
            seqs.append(
                build_sequence(
                    request,
                    tokenizer=self.tokenizer,
                    eos_ids=frozenset(),
                    vocab_size=len(self.tokenizer),
                    max_model_len=2048,
                    seed=self.seed,
                )
            )
        return seqs

    def run(self, batch: DecodeBatch | None = None) -> list[SequenceState]:
        """One generation on `batch` (default: the workload's own); returns its rows."""
        batch = self.batch if batch is None else batch
        seqs = self.sequences()
        batch.admit(seqs)
        while len(batch):
            batch.step()
        return seqs


def timed_generations(work: Workload, generations: int) -> dict[str, float]:
    """Per-step CPU ms of `DecodeBatch.step` and its two parts, medians over generations."""
    batch = work.batch
    spent = {"forward": 0.0, "sample": 0.0}
    forward, sample = batch._forward, batch._sample_and_record

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args)
            finally:
                spent[key] += time.thread_time() - start

        return call

    batch._forward = timed("forward", forward)  # type: ignore[method-assign]
    batch._sample_and_record = timed("sample", sample)  # type: ignore[method-assign]
    rows: dict[str, list[float]] = {"step_ms": [], "forward_ms": [], "sample_and_record_ms": []}
    try:
        work.run()  # warm-up
        for _ in range(generations):
            spent.update(forward=0.0, sample=0.0)
            batch.admit(work.sequences())
            start, steps = time.thread_time(), 0
            while len(batch):
                batch.step()
                steps += 1
            rows["step_ms"].append((time.thread_time() - start) / steps * 1e3)
            rows["forward_ms"].append(spent["forward"] / (steps - 1) * 1e3)  # the last has none
            rows["sample_and_record_ms"].append(spent["sample"] / steps * 1e3)
    finally:
        del batch._forward, batch._sample_and_record
    return {key: statistics.median(values) for key, values in rows.items()}


class _Kernels:
    """Swaps the lean forward's GEMM (`_matmul`) and SDPA for recording or stub versions."""

    def __init__(self) -> None:
        self.matmul, self.sdpa = lean_forward._matmul, F.scaled_dot_product_attention
        self.gemms: list[Callable[[], Any]] = []
        self.attentions: list[Callable[[], Any]] = []
        self._outputs: dict[tuple[Any, ...], torch.Tensor] = {}

    def record(self) -> None:
        def matmul(*args: Any) -> torch.Tensor:
            self.gemms.append(functools.partial(self.matmul, *args))
            return self.matmul(*args)

        def sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
            self.attentions.append(functools.partial(self.sdpa, *args, **kwargs))
            return self.sdpa(*args, **kwargs)

        self._swap(matmul, sdpa)

    def stub(self) -> None:
        """Each GEMM and SDPA returns the output it first gave for its shapes (no compute):
        what is left of a step is its elementwise ops and Python."""

        def matmul(x: torch.Tensor, weight: torch.Tensor, *args: Any) -> torch.Tensor:
            key = (x.shape, weight.shape, *args)
            if key not in self._outputs:
                self._outputs[key] = self.matmul(x, weight, *args)
            return self._outputs[key]

        def sdpa(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if q.shape not in self._outputs:
                self._outputs[q.shape] = self.sdpa(q, *args, **kwargs)
            return self._outputs[q.shape]

        self._swap(matmul, sdpa)

    def restore(self) -> None:
        self._swap(self.matmul, self.sdpa)

    def _swap(self, matmul: Callable[..., Any], sdpa: Callable[..., Any]) -> None:
        lean_forward._matmul = matmul  # type: ignore[assignment]
        F.scaled_dot_product_attention = sdpa  # type: ignore[assignment]


def captured_kernels(work: Workload) -> _Kernels:
    """The GEMM and SDPA calls of one decode forward half-way through a generation, as
    replayable calls on the very tensors (and layouts) the forward passed."""
    batch = work.batch
    batch.admit(work.sequences())
    for _ in range(COMPLETION_TOKENS // 2):
        batch.step()
    kernels = _Kernels()
    kernels.record()
    try:
        batch.step()
    finally:
        kernels.restore()
        batch.reset()
    return kernels


def without_kernels(work: Workload, generations: int) -> dict[str, float]:
    """`timed_generations` with every GEMM and SDPA stubbed out (the tokens are meaningless;
    every row still runs its 64 steps)."""
    kernels = _Kernels()
    kernels.stub()
    try:
        split = timed_generations(work, generations)
    finally:
        kernels.restore()
    return {f"{key[:-3]}_without_gemm_attention_ms": value for key, value in split.items()}


def replay_ms(calls: list[Callable[[], Any]], repeats: int = 30) -> float:
    """CPU ms of running `calls` once each, median over `repeats`."""
    with torch.inference_mode():
        for call in calls:
            call()
        times = []
        for _ in range(repeats):
            start = time.thread_time()
            for call in calls:
                call()
            times.append((time.thread_time() - start) * 1e3)
    return statistics.median(times)


def down_projection_forms(model_name: str, row_counts: tuple[int, ...]) -> list[dict[str, Any]]:
    """The down projection's GEMM on the activation layout the forward's chain produces (the
    SiLU product of a transposed gate/up view): `W @ x.T` against `F.linear(x, W)`."""
    spec = TinyModelSpec(**MODEL_SPECS[model_name])
    weight_EI = torch.randn(spec.hidden_size, spec.intermediate_size) * 0.05
    out = []
    for rows in row_counts:
        x_NI = torch.randn(spec.intermediate_size, rows).t()  # transposed storage, as in the chain
        transposed = functools.partial(_transposed_form, weight_EI, x_NI)
        linear = functools.partial(F.linear, x_NI, weight_EI)
        out.append(
            {
                "rows": rows,
                "w_at_x_t_ms": replay_ms([transposed], repeats=50),
                "linear_ms": replay_ms([linear], repeats=50),
                "bit_equal": bool(torch.equal(transposed(), linear())),
            }
        )
    return out


def _transposed_form(weight_OI: torch.Tensor, x_NI: torch.Tensor) -> torch.Tensor:
    return torch.mm(weight_OI, x_NI.t()).t()


def compare_prepacked(work: Workload, rounds: int) -> dict[str, Any]:
    """Today's GEMMs against `EngineConfig(prepacked_gemm=True)`'s, on copies of one model:
    per-step CPU ms of whole generations, interleaved and order-swapped round by round; and how
    far the logprobs of the same seeded rows move (on rows whose tokens stayed the same)."""
    packed = DecodeBatch(copy.deepcopy(work.model), work.batch.codec, prepacked_gemm=True)
    batches = {"default": work.batch, "prepacked": packed}
    seed, rows = work.seed, {}
    for name, batch in batches.items():  # the same seeds on both
        work.seed = seed
        rows[name] = work.run(batch)
    same = [
        (a, b)
        for a, b in zip(rows["default"], rows["prepacked"], strict=True)
        if a.completion_ids == b.completion_ids
    ]
    moved = [abs(x - y) for a, b in same for x, y in zip(a.logprobs, b.logprobs, strict=True)]
    times: dict[str, list[float]] = {name: [] for name in batches}
    for r in range(rounds):
        for name in sorted(batches, reverse=r % 2 == 1):
            start = time.thread_time()
            work.run(batches[name])
            times[name].append((time.thread_time() - start) / COMPLETION_TOKENS * 1e3)
    default, prepacked = (statistics.median(times[name]) for name in batches)
    return {
        "default_step_ms": default,
        "prepacked_step_ms": prepacked,
        "prepacked_over_default": prepacked / default,
        "rows_with_the_same_tokens": f"{len(same)}/{len(rows['default'])}",
        "max_abs_logprob_change_on_them": max(moved, default=0.0),
        "rounds": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODEL_SPECS), default="tiny")
    parser.add_argument("--generations", type=positive_int, default=5, help="measured generations")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch intra-op threads")
    parser.add_argument("--forms", action="store_true", help="also compare the GEMM forms")
    parser.add_argument(
        "--compare-prepacked",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: today's GEMMs against EngineConfig(prepacked_gemm=True), ROUNDS rounds",
    )
    args = show_defaults(parser).parse_args()
    torch.set_num_threads(args.threads)
    work = Workload(args.model)
    if args.compare_prepacked:
        compared = compare_prepacked(work, args.compare_prepacked)
        print(json.dumps({"model": args.model, **compared, "load_avg": os.getloadavg()}, indent=2))
        return
    split = timed_generations(work, args.generations)
    kernels = captured_kernels(work)
    gemm, attention = replay_ms(kernels.gemms), replay_ms(kernels.attentions)
    stubbed = without_kernels(work, args.generations)
    result: dict[str, Any] = {
        "model": args.model,
        "parameters": sum(p.numel() for p in work.model.parameters()),
        "rows": PROMPTS * GROUP_SIZE,
        "completion_tokens": COMPLETION_TOKENS,
        "threads": args.threads,
        "unit": "CPU ms of this thread per decode step (median over generations)",
        **split,
        **stubbed,
        "gemm_and_attention_in_place_ms": split["step_ms"]
        - stubbed["step_without_gemm_attention_ms"],
        "gemm_replayed_alone_ms": gemm,
        "gemm_calls": len(kernels.gemms),
        "attention_replayed_alone_ms": attention,
        "attention_calls": len(kernels.attentions),
        "load_avg": os.getloadavg(),
    }
    if args.forms:
        result["down_projection_forms"] = down_projection_forms(args.model, (2, 4, 8, 16, 32))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
