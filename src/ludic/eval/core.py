"""`run_eval`: run evaluation requests, summarise every episode, reduce the summaries to metrics.

Evaluation is rollout execution plus bookkeeping: it uses `ludic.rollouts` and never the
training stack (no credit assignment, no samples, no torch). It does not build envs or clients;
`command.py` does that for the `ludic eval` command.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from ludic.eval.progress import EvalProgress
from ludic.eval.records import (
    EpisodeRecord,
    StepRecord,
    SuccessFn,
    episode_record,
    reward_success,
    step_records,
    write_records_jsonl,
)
from ludic.eval.reducers import Reducer, default_reducers, group_episodes, reduce_metrics
from ludic.inference.sampling import SamplingConfig
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    derive_seed,
    write_rollouts_jsonl,
)
from ludic.rollouts.engine import warn_if_all_failed
from ludic.types import Rollout

DEFAULT_CONCURRENCY = 32


@runtime_checkable
class RolloutRunner(Protocol):
    """What evaluation needs from an engine (`ludic.rollouts.RolloutEngine` is one)."""

    async def run(self, requests: Sequence[RolloutRequest]) -> list[Rollout]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalResult:
    """The rollouts of one evaluation, their per-episode and per-turn records, and metrics."""

    rollouts: list[Rollout]
    episodes: list[EpisodeRecord]
    steps: list[StepRecord]
    metrics: dict[str, float]

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write episodes.jsonl, steps.jsonl, rollouts.jsonl (for `ludic view`) and
        metrics.json into `out_dir` (created; existing files are replaced)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            name: out / file
            for name, file in (
                ("episodes", "episodes.jsonl"),
                ("steps", "steps.jsonl"),
                ("rollouts", "rollouts.jsonl"),
                ("metrics", "metrics.json"),
            )
        }
        write_records_jsonl(self.episodes, paths["episodes"])
        write_records_jsonl(self.steps, paths["steps"])
        with paths["rollouts"].open("w", encoding="utf-8") as f:
            write_rollouts_jsonl(self.rollouts, f)
        paths["metrics"].write_text(json.dumps(self.metrics, indent=2) + "\n", encoding="utf-8")
        return paths


def summarise(
    rollouts: Sequence[Rollout],
    reducers: Mapping[str, Reducer] | None = None,
    *,
    success_fn: SuccessFn = reward_success,
) -> EvalResult:
    """Records and metrics for rollouts already collected (e.g. read from a JSONL log).

    Without `reducers`, uses `default_reducers` with pass@k / mean@k for k = 1 and k = the
    smallest group size, when every problem has more than one sample.
    """
    episodes = [episode_record(r, success_fn) for r in rollouts]
    steps = [s for r in rollouts for s in step_records(r)]
    if reducers is None:
        reducers = default_reducers(_default_k_values(episodes))
    return EvalResult(
        rollouts=list(rollouts),
        episodes=episodes,
        steps=steps,
        metrics=reduce_metrics(reducers, episodes),
    )


async def run_eval(
    engine: RolloutRunner,
    requests: Sequence[RolloutRequest],
    reducers: Mapping[str, Reducer] | None = None,
    *,
    success_fn: SuccessFn = reward_success,
    progress: bool = False,
    out_dir: str | Path | None = None,
) -> EvalResult:
    """Run `requests` on `engine` (one episode each) and summarise them (see `summarise`).

    `progress` shows a bar over episodes with the running mean reward; `out_dir` writes the
    records (see `EvalResult.write`). A failed episode is recorded, never raised.
    """
    requests = list(requests)
    if progress:
        rollouts = await _run_with_progress(engine, requests, success_fn)
    else:
        rollouts = await engine.run(requests)
    result = summarise(rollouts, reducers, success_fn=success_fn)
    if out_dir is not None:
        result.write(out_dir)
    return result


async def _run_with_progress(
    engine: RolloutRunner, requests: Sequence[RolloutRequest], success_fn: SuccessFn
) -> list[Rollout]:
    # One engine call per request so the bar moves as episodes finish; the engine's own
    # concurrency limit applies per call, so the same limit is enforced here.
    limit = int(getattr(engine, "concurrency", DEFAULT_CONCURRENCY))
    semaphore = asyncio.Semaphore(max(1, limit))
    engine_log = logging.getLogger(RolloutEngine.__module__)
    once = _OneBatchLog()
    engine_log.addFilter(once)
    try:
        with EvalProgress(total=len(requests)) as bar:

            async def one(request: RolloutRequest) -> list[Rollout]:
                _FILTERED_BY.set(once)  # this task's engine lines only: not another run's
                async with semaphore:
                    rollouts = await engine.run([request])
                bar.advance([episode_record(r, success_fn) for r in rollouts])
                return rollouts

            per_request = await asyncio.gather(*(one(r) for r in requests))
    finally:
        engine_log.removeFilter(once)
    rollouts = [r for rollouts in per_request for r in rollouts]
    if isinstance(engine, RolloutEngine):
        warn_if_all_failed(rollouts)  # once over the evaluation, as one engine.run says it
    return rollouts


_FILTERED_BY: contextvars.ContextVar[_OneBatchLog | None] = contextvars.ContextVar(
    "ludic_eval_filtered_by", default=None
)
"""The `_OneBatchLog` of the progress run whose per-episode task logs (set in each task)."""


class _OneBatchLog(logging.Filter):
    """The engine's once-per-`run` lines, said once over a progress run's per-episode calls:
    the first failed episode's traceback only, and no "every one of the 1 episodes in this
    batch failed" per failed episode (`_run_with_progress` says it once, over them all)."""

    def __init__(self) -> None:
        super().__init__()
        self.traceback_logged = False

    def filter(self, record: logging.LogRecord) -> bool:
        if _FILTERED_BY.get() is not self:  # a line of an engine run outside this evaluation
            return True
        message = record.msg if isinstance(record.msg, str) else ""
        if message.startswith("every one of the %d episodes in this batch failed"):
            return False
        if message.startswith("traceback of episode "):
            if self.traceback_logged:
                return False
            self.traceback_logged = True
        return True


def make_eval_requests(
    *,
    env: ComponentSpec,
    protocol: ComponentSpec,
    num_problems: int,
    samples_per_problem: int = 1,
    seed: int = 0,
    sampling: SamplingConfig | None = None,
    meta: Mapping[str, object] | None = None,
) -> list[RolloutRequest]:
    """Requests for `num_problems` problems (env seeds `seed`, `seed + 1`, ...) with
    `samples_per_problem` episodes each (one group per problem, distinct sampling seeds), so
    pass@k for k <= samples_per_problem can be computed."""
    if num_problems < 1:
        raise ValueError(f"num_problems must be >= 1, got {num_problems}")
    if samples_per_problem < 1:
        raise ValueError(f"samples_per_problem must be >= 1, got {samples_per_problem}")
    base = [
        RolloutRequest(
            env=env,
            protocol=protocol,
            env_seed=seed + i,
            sampling_seed=derive_seed(seed, "eval-sampling", i),
            sampling=sampling or SamplingConfig(),
            request_id=f"problem-{i}",
            meta={**(meta or {}), "problem_index": i},
        )
        for i in range(num_problems)
    ]
    expanded = GRPORequestStrategy(group_size=samples_per_problem).expand(base)
    return [replace(r, meta={**r.meta, "eval": True}) for r in expanded]


def _default_k_values(episodes: Sequence[EpisodeRecord]) -> tuple[int, ...]:
    groups = group_episodes(episodes)
    if not groups:
        return ()
    n = min(len(members) for members in groups.values())
    return (1, n) if n > 1 else ()
