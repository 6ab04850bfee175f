"""What `ludic learner` logs: one line per step (`report_step`, with a warning when the actors
sample another model than the learner's) and a closing line (`report_done`), each counting what
all ranks trained (summed through the runtime's all-reduce, a collective every rank calls) and
logged by rank 0 alone; `NothingTrainedLearnerError` when a launch applied no update. It does
not train, checkpoint or warn about steps that changed no weight
(`ludic.training.stall.NoSignalWatch`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ludic.errors import Refusal

logger = logging.getLogger(__name__)

TOTAL_KEYS = (
    "samples",
    "redelivered",
    "duplicates",
    "dropped_stale",
    "dead_branch",
    "downweighted",
    "ahead",
    "invalid",
    "foreign_run",
    "trimmed",
    "timed_out",
)
"""What `PipelineBatchSource.totals` counts, summed over ranks for the closing line."""


def report_step(trainer: Any, source: Any, metrics: dict[str, float]) -> str | None:
    """After each step, on every rank: rank 0 logs `step_line` with all ranks' sample count
    (the Trainer's `num_samples`, which it sums over ranks itself).
    Returns why the learner stops when every rank's batch came back empty (`source.timed_out`):
    `source.exhausted_line` with the stale samples all ranks dropped while they waited
    (`source.timed_out_dropped`); else None."""
    runtime = trainer.runtime
    timed_out, dropped = across_ranks(
        runtime, [float(source.timed_out), float(source.timed_out_dropped)]
    )
    samples = metrics.get("num_samples", 0.0)
    if source.rank == 0:
        logger.info(step_line(trainer.step, metrics, samples, runtime.world_size))
        if (foreign := foreign_policy_line(metrics)) is not None:
            logger.warning(foreign)
    if timed_out != runtime.world_size:
        return None
    return str(source.exhausted_line(int(dropped), runtime.world_size))


def report_done(trainer: Any, source: Any, *, trained: bool = True) -> dict[str, int]:
    """At the end, on every rank: rank 0 logs `done_line` with all ranks' `source.totals`
    (`trained`: whether any step of this launch applied an update). Returns those totals (the
    non-zero ones), the same on every rank."""
    runtime = trainer.runtime
    totals = across_ranks(runtime, [float(source.totals[k]) for k in TOTAL_KEYS])
    counts = {k: int(v) for k, v in zip(TOTAL_KEYS, totals, strict=True) if v}
    if source.rank == 0:
        logger.info(done_line(trainer, counts, runtime.world_size, trained=trained))
    return counts


class NothingTrainedLearnerError(Refusal, RuntimeError):
    """A `ludic learner` launch that applied no update (it stopped under `--max-wait-s` before
    any trainable sample came, or every step was skipped): as `ludic train` ends with
    NothingTrainedError, the command exits 1 instead of 0, so a script or supervisor that
    waits on it sees that the run made no progress."""


def nothing_trained_line(stop: str | None, totals: dict[str, int], steps: int) -> str:
    """Why a launch of `steps` step(s) applied no update: `stop`, the line it stopped with
    (None: it ran its steps, each skipped), and what became of the samples it read over the
    whole launch (`stop` counts only its last wait's, and under torchrun no dead-lettering)."""
    why = stop or f"each of its {steps} step(s) was skipped (each said why above)"
    fates = ", ".join(f"{totals[k]} {what}" for k, what in _UNTRAINED.items() if totals.get(k))
    untrained = f"; over this launch, samples read but not trained: {fates}" if fates else ""
    return (
        f"no step trained in this launch: {why}{untrained}. The model is the one this launch "
        "started from and it published no new policy version: fix the cause and start the "
        "learner again"
    )


_UNTRAINED = {
    "dropped_stale": "dropped as stale (more than --max-lag policy versions behind)",
    "dead_branch": "dropped as a killed learner's (versions past this one's start)",
    "foreign_run": "dead-lettered as another run's",
    "invalid": "dead-lettered as invalid",
    "duplicates": "skipped as duplicates",
}
"""The `TOTAL_KEYS` that count samples read but never trained, and what became of them."""


def across_ranks(runtime: Any, values: list[float]) -> list[float]:
    """`values` summed over the learner ranks (a collective: every rank calls it)."""
    return list(values) if runtime.world_size == 1 else list(runtime.all_reduce_sum(values))


def step_line(step: int, metrics: dict[str, float], samples: float, world_size: int) -> str:
    """One INFO line per step: `samples` trained by all ranks and their policy lag (`_lags`);
    with several ranks the reward is rank 0's and says so."""
    get = metrics.get
    ranks, rank0 = (f" on {world_size} ranks", " on rank 0") if world_size > 1 else ("", "")
    lags = _lags(metrics)
    return (
        f"learner step {step}: {int(samples)} samples{ranks}{f' ({lags})' if lags else ''}, "
        f"mean reward per sample{rank0} {get('reward_mean', math.nan):+.3f}, loss "
        f"{get('loss', math.nan):.4g}, grad norm {get('grad_norm', math.nan):.3g}, policy "
        f"version {int(get('policy_version', 0))}, {get('step_seconds', math.nan):.1f}s"
    )


def _lags(metrics: dict[str, float]) -> str:
    """The step's policy lags as the Trainer counts them over all ranks (`policy_lag/*`): the
    largest lag of the samples at or behind the learner's version, and apart from them the
    samples of a version ahead of it (weights it never held sampled them: warned once) or of
    none recorded. Empty when the step trained no sample."""
    parts = []
    if "policy_lag/max" in metrics:
        parts.append(f"policy lag max {int(metrics['policy_lag/max'])}")
    if ahead := int(metrics.get("policy_lag/ahead", 0)):
        parts.append(f"{ahead} ahead of the learner's policy version")
    if unknown := int(metrics.get("policy_lag/unknown", 0)):
        parts.append(f"{unknown} of no recorded policy version")
    return "; ".join(parts)


FOREIGN_POLICY_SHARE = 0.5
"""Share of a lag-0 step's action tokens off the learner's logprobs (`mismatch/frac_beyond`:
|log ratio| > MISMATCH_LOG_RATIO_THRESHOLD) beyond which the actors cannot be sampling the
learner's weights as the learner scores them; kernels and dtypes (bf16 on vLLM) move a few
percent of tokens that far, another model or raw logprobs at a temperature other than 1 most
of them."""


def foreign_policy_line(metrics: dict[str, float]) -> str | None:
    """A warning when every sample of the step is at policy lag 0, so its behaviour logprobs
    should be the learner's own up to float noise, yet most action tokens differ: the actors
    sample another model (an embedded actor's other --model, a server the learner does not
    publish to), or the server returns raw logprobs (`ludic serve --logprobs-mode raw`, vLLM's
    raw_logprobs: the model's before temperature) while the actors sample at a temperature
    other than 1, which the learner applies when it recomputes them. None otherwise."""
    from ludic.training.mismatch import MISMATCH_LOG_RATIO_THRESHOLD  # torch: not at import

    share = metrics.get("loss/mismatch/frac_beyond")
    if share is None or metrics.get("policy_lag/max") != 0 or share <= FOREIGN_POLICY_SHARE:
        return None
    return (
        f"{share:.0%} of this step's action tokens were sampled with a logprob more than "
        f"{MISMATCH_LOG_RATIO_THRESHOLD} from the learner's recomputation (mean |log ratio| "
        f"{metrics.get('loss/mismatch/abs_log_ratio_mean', math.nan):.2f}) although every "
        "sample is at policy lag 0: either the actors sample another model than this learner's "
        "--model (an actor's own --model without --server-url, or a server this learner does "
        "not publish to: start them on the learner's model and --server-url), or the server "
        "returns raw logprobs (`ludic serve --logprobs-mode raw`, vLLM raw_logprobs: before "
        "temperature) while the actors sample at a temperature other than 1 (serve with "
        "--logprobs-mode processed, the default, or sample at temperature 1)"
    )


def done_line(
    trainer: Any, totals: dict[str, int], world_size: int = 1, *, trained: bool = True
) -> str:
    """The closing line: the step reached, what all ranks read and what became of it
    (`_read_line`), and where the model is (`trained`: whether any step of this launch
    applied an update; none: no checkpoint was written for it)."""
    newest = None if trainer.checkpoints is None else trainer.checkpoints.path_for(trainer.step)
    if newest is not None and newest.is_dir():
        where = f"model: {newest / 'model'}"
    elif trainer.step == 0 or not trained:  # stopped before training (--max-wait-s)
        where = "no step trained, so no checkpoint was written"
    elif newest is None:
        where = "no checkpoint kept (--checkpoint-every None), so the trained weights are gone"
    else:
        where = f"no checkpoint at {newest}, so the weights of step {trainer.step} are gone"
    return f"learner done at step {trainer.step}: {_read_line(totals, world_size)}; {where}"


def _read_line(totals: dict[str, int], world_size: int) -> str:
    """`totals` in words: '96 samples read on 2 ranks, 64 of them trained, 32 dropped as stale
    (...), 4 redelivered (...)'. `samples` counts every sample of its run read, the stale ones and
    a dead learner's dropped untrained included: when some were dropped, it says how many of
    those read were trained, so `samples` is not taken for the trained count."""
    if not totals:
        return "no sample read"
    read = totals.get("samples", 0)
    ranks = f" on {world_size} ranks" if world_size > 1 else ""
    parts = [f"{read} sample{'' if read == 1 else 's'} read{ranks}"]
    if any(totals.get(k) for k in _DROPPED):
        parts.append(f"{read - sum(totals.get(k, 0) for k in _DROPPED)} of them trained")
    parts += [f"{totals[k]} {what}" for k, what in _WORDS.items() if totals.get(k)]
    return ", ".join(parts)


_DROPPED = ("dropped_stale", "dead_branch")
"""The totals counted under `samples` but not trained."""

_WORDS = {
    **{key: _UNTRAINED[key] for key in _DROPPED},
    "downweighted": "trained downweighted as stale (--stale downweight)",
    "ahead": "of a policy version ahead of the learner's (trained; warned above)",
    "redelivered": "redelivered (read but not acknowledged before a restart or a lost Redis reply)",
    **{key: _UNTRAINED[key] for key in ("duplicates", "foreign_run", "invalid")},
    "trimmed": "trimmed from the stream before they were trained (lost)",
    "timed_out": "rank waits timed out without a sample (--max-wait-s)",
}
"""The `TOTAL_KEYS` but `samples`, in the closing line's words."""
