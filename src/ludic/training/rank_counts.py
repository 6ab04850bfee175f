"""A step's sample counts over all ranks. Under FSDP2 each rank selects its own share of the
batch, while the loss, `grad_norm` and `num_action_tokens` are the global batch's; summing the
counts too makes `metrics.jsonl` (written by rank 0) count the samples its loss was taken over.
Per-sample statistics (`reward_mean`, the `reducers`) stay per rank, and a skipped step's cause
is said from the rank's own counts before they are summed.
"""

from __future__ import annotations

from collections.abc import Mapping

from ludic.training.mismatch import LAG_BUCKETS
from ludic.training.parallel.runtime import TrainingRuntime

_LAGGED = tuple(f"policy_lag/{b}" for b in ("0", "1", "2", f"{LAG_BUCKETS}+"))
"""The histogram buckets of samples with a lag >= 0 (what `policy_lag/mean` and `/max` read)."""

SUMMED_COUNTS = (
    "num_samples_in",
    "dropped_stale",
    "dropped_no_action_tokens",
    "num_samples",
    *_LAGGED,
    "policy_lag/unknown",
    "policy_lag/ahead",
)
"""`Trainer.train_step` metrics that count samples: summed over ranks."""


def counts_over_ranks(runtime: TrainingRuntime, metrics: Mapping[str, float]) -> dict[str, float]:
    """The `SUMMED_COUNTS` of `metrics` summed over ranks, with `policy_lag/mean` and `/max` of
    all ranks' samples (a collective: every rank calls it, whatever its own metrics hold). A
    count this rank does not log stays out; the lag summary is there when any rank has one."""
    lagged = sum(metrics.get(key, 0.0) for key in _LAGGED)
    local = [metrics.get(key, 0.0) for key in SUMMED_COUNTS]
    *totals, lag_sum = runtime.all_reduce_sum(
        [*local, metrics.get("policy_lag/mean", 0.0) * lagged]
    )
    lag_max = runtime.all_reduce_max(int(metrics.get("policy_lag/max", -1)))
    summed = dict(zip(SUMMED_COUNTS, totals, strict=True))
    result = {key: total for key, total in summed.items() if key in metrics}
    all_lagged = sum(summed[key] for key in _LAGGED)
    if all_lagged:
        result["policy_lag/mean"] = lag_sum / all_lagged
        result["policy_lag/max"] = float(lag_max)
    return result
