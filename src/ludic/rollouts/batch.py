"""`generate_batch`: requests in, training samples out (expand, run, assign credit, stitch,
filter). The one call the training side needs. It does not collate tensors or train.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from ludic._aio import run_in_worker
from ludic.rollouts.build_samples import SampleMode, SnapshotPolicy, build_samples
from ludic.rollouts.engine import RolloutEngine, warn_if_all_failed
from ludic.rollouts.requests import RequestStrategy, RolloutRequest
from ludic.rollouts.retokenize import Retokenizer
from ludic.rollouts.samples import CreditAssigner, SampleFilter, SAWItem
from ludic.types import JSON, Rollout

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchStats:
    """Counts over one batch. `mean_reward` averages `total_reward` over non-failed rollouts
    (0.0 when every rollout failed). `num_failed` includes `num_build_failed` (rollouts whose
    samples could not be built); `num_log_failures` counts rollouts the engine's `jsonl_log`
    could not record (they still train). `num_incomplete` counts model calls cut off at
    `max_tokens` (finish_reason "length"), `num_incomplete_rejected` those of them an agent
    with `reject_incomplete_completions=True` turned into a parse failure (the parser never
    saw them); when most calls are cut off, raise `max_tokens`."""

    num_requests: int
    num_rollouts: int
    num_failed: int
    num_timed_out: int
    num_agent_steps: int
    num_samples: int
    num_filtered_out: int
    num_snapshots: int
    num_truncated_episodes: int
    mean_reward: float
    num_build_failed: int = 0
    num_log_failures: int = 0
    num_drift_splits: int = 0
    num_incomplete: int = 0
    num_incomplete_rejected: int = 0

    def to_dict(self) -> JSON:
        return asdict(self)


def every_episode_failed(record: Mapping[str, object], *, prefix: str = "batch/") -> bool:
    """Whether a metrics record's batch had episodes and every one failed (num_failed >=
    num_rollouts > 0): its mean_reward is then the 0.0 `BatchStats` holds for no episode, not a
    reward earned (`ludic plot` gaps it, closing lines skip it). `prefix` names where the counts
    are: "batch/" in the Trainer's metrics, "" in the per-batch records of `ludic actor
    --metrics-path`. A record without both counts as numbers is not such a batch."""
    failed = record.get(f"{prefix}num_failed")
    rollouts = record.get(f"{prefix}num_rollouts")
    if isinstance(failed, bool) or isinstance(rollouts, bool):
        return False
    if not isinstance(failed, int | float) or not isinstance(rollouts, int | float):
        return False
    return 0 < rollouts <= failed


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchResult:
    """The samples to train on, the rollouts they came from (failed ones included) and stats."""

    samples: list[SAWItem]
    rollouts: list[Rollout]
    stats: BatchStats


async def generate_batch(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    credit_assigner: CreditAssigner,
    *,
    filters: Sequence[SampleFilter] = (),
    strategy: RequestStrategy | None = None,
    sample_mode: SampleMode = "turn",
    snapshot_policy: SnapshotPolicy = "share",
    retokenizer: Retokenizer | None = None,
) -> BatchResult:
    """Expand `requests` with `strategy`, run them, weight turns, build and filter samples.

    The credit assigner sees only the non-failed rollouts, so a failed episode never enters a
    group baseline. A rollout whose samples cannot be built (e.g. an agent step without a token
    trace) becomes a failed rollout (`meta["error_phase"] == "build_samples"`, its steps kept
    for inspection) and credit is assigned again without it; the rest of the batch trains.
    A sample is kept when every filter returns True. Credit and sample building run on a
    worker thread: a credit assigner can be slow (AWR's "value" baseline fits a model), and on
    the event loop it would stall every episode still running there (a prefetched batch).
    So the assigner and `retokenizer` should only read a tokenizer they share with the engine
    (a call that sets truncation or padding races the engine's on tokenizers < 0.23).
    """
    # bad settings raise before any episode runs
    build_samples([], {}, mode=sample_mode, snapshot_policy=snapshot_policy)
    check_credit_fits_mode(credit_assigner, sample_mode)
    expanded = strategy.expand(requests) if strategy is not None else list(requests)
    rollouts = await engine.run(expanded)
    ok = [r for r in rollouts if not r.failed]
    built, broken = await run_in_worker(
        build_rollout_samples, ok, credit_assigner, sample_mode, snapshot_policy, retokenizer
    )
    for rollout, _ in broken:
        logger.warning("rollout %s: %s", rollout.id, rollout.meta["error"])
    if broken:
        # the rollouts that just failed stay in the credit's view, marked failed (every
        # assigner leaves those out): HierarchicalCredit then sees a child's parent failed
        # and keeps the child's own weight, instead of refusing a parent it cannot find
        credit_view = ok
        ok = [r for r in ok if not r.failed]
        built, _ = await run_in_worker(
            build_rollout_samples,
            ok,
            credit_assigner,
            sample_mode,
            snapshot_policy,
            retokenizer,
            credit_view,
        )
        if not ok:  # the engine saw some succeed; building samples failed the rest
            warn_if_all_failed(rollouts, stage=" (building samples)")
    calls = [s for r in ok for s in r.agent_steps]
    samples = [s for s in built if all(f(s) for f in filters)]
    stats = BatchStats(
        num_requests=len(expanded),
        num_rollouts=len(rollouts),
        num_failed=len(rollouts) - len(ok),
        num_timed_out=sum(1 for r in rollouts if r.meta.get("error_phase") == "timeout"),
        num_agent_steps=sum(len(r.agent_steps) for r in ok),
        num_samples=len(samples),
        num_filtered_out=len(built) - len(samples),
        num_snapshots=sum(1 for s in samples if s.meta.get("is_snapshot")),
        num_drift_splits=sum(1 for s in samples if s.meta.get("drift_split")),
        num_truncated_episodes=sum(1 for r in ok if r.meta.get("episode_truncated")),
        mean_reward=sum(r.total_reward for r in ok) / len(ok) if ok else 0.0,
        num_build_failed=len(broken),
        num_log_failures=sum(1 for r in rollouts if "log_error" in r.meta),
        num_incomplete=sum(1 for s in calls if s.finish_reason == "length"),
        num_incomplete_rejected=sum(1 for s in calls if s.info.get("incomplete_completion")),
    )
    return BatchResult(samples=samples, rollouts=rollouts, stats=stats)


Broken = list[tuple[Rollout, Exception]]
"""The rollouts whose samples could not be built, each with what it raised."""


def check_credit_fits_mode(credit_assigner: CreditAssigner, mode: SampleMode) -> None:
    """Refuse credit split over an episode's turns (`split_over_turns`) in sample mode
    "episode": the episode is one sample there, whose weight would be A / turns instead of A."""
    if mode == "episode" and getattr(credit_assigner, "split_over_turns", False):
        raise ValueError(
            f"{type(credit_assigner).__name__}(split_over_turns=True) with sample_mode "
            "'episode': an episode is one sample there, so splitting its advantage over its "
            "turns would only shrink it; pass split_over_turns=False (make_grpo's default), "
            "or sample_mode='turn'"
        )


def build_rollout_samples(
    rollouts: Sequence[Rollout],
    credit_assigner: CreditAssigner,
    mode: SampleMode,
    snapshot_policy: SnapshotPolicy,
    retokenizer: Retokenizer | None,
    credit_view: Sequence[Rollout] | None = None,
) -> tuple[list[SAWItem], Broken]:
    """Weight (over `credit_view`, default `rollouts`) and build samples rollout by rollout;
    a rollout that fails to build is marked failed in place (`meta["error_phase"] ==
    "build_samples"`). Returns the samples and the rollouts that raised, with what; the
    caller says so (one line each online, one summary offline) and assigns credit again."""
    check_credit_fits_mode(credit_assigner, mode)
    weights = credit_assigner.assign(rollouts if credit_view is None else credit_view)
    samples: list[SAWItem] = []
    broken: Broken = []
    for rollout in rollouts:
        try:
            samples += build_samples(
                [rollout],
                weights,
                mode=mode,
                snapshot_policy=snapshot_policy,
                retokenizer=retokenizer,
            )
        except Exception as e:
            broken.append((rollout, e))
            rollout.meta.update(
                error=f"building samples failed: {type(e).__name__}: {e}",
                error_type=type(e).__name__,
                error_phase="build_samples",
            )
    return samples, broken
