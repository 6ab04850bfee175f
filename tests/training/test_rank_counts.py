"""`counts_over_ranks`: a step's sample counts summed over ranks, the lag mean weighted by each
rank's lagged samples and the lag max the largest (this process plays rank 0 of 2, the other
rank's values are given). The 2-rank FSDP run checks the same against one process
(`test_fsdp.py`)."""

from __future__ import annotations

from collections.abc import Sequence

from ludic.training.parallel.runtime import LocalRuntime
from ludic.training.rank_counts import SUMMED_COUNTS, counts_over_ranks


class TwoRanks(LocalRuntime):
    """Rank 0 of 2; the other rank's metrics are `peer`."""

    def __init__(self, peer: dict[str, float]) -> None:
        super().__init__("cpu")
        self.peer = peer

    @property
    def world_size(self) -> int:
        return 2

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        other = counts_of(self.peer)
        return [a + b for a, b in zip(values, other, strict=True)]

    def all_reduce_max(self, value: int) -> int:
        return max(value, int(self.peer.get("policy_lag/max", -1)))


def counts_of(metrics: dict[str, float]) -> list[float]:
    lagged = sum(metrics.get(f"policy_lag/{b}", 0.0) for b in ("0", "1", "2", "3+"))
    return [metrics.get(k, 0.0) for k in SUMMED_COUNTS] + [
        metrics.get("policy_lag/mean", 0.0) * lagged
    ]


def lags(zero: float, one: float, three: float, unknown: float = 0.0) -> dict[str, float]:
    """A rank's policy_lag metrics as `policy_lag_metrics` writes them."""
    out = {"policy_lag/0": zero, "policy_lag/1": one, "policy_lag/2": 0.0}
    out |= {"policy_lag/3+": three, "policy_lag/unknown": unknown, "policy_lag/ahead": 0.0}
    if zero + one + three:
        out["policy_lag/mean"] = (one + 3 * three) / (zero + one + three)
        out["policy_lag/max"] = 3.0 if three else (1.0 if one else 0.0)
    return out


def test_counts_sum_and_the_lag_summary_covers_both_ranks() -> None:
    # rank 0: 3 samples in, 1 stale, 2 trained at lag 0 and 1;
    # rank 1: 5 in, 1 without an action token, 4 trained at lags 0, 1, 3, 3
    mine = {"num_samples_in": 3.0, "dropped_stale": 1.0, "dropped_no_action_tokens": 0.0}
    mine |= {"num_samples": 2.0, "reward_mean": 0.5, **lags(1, 1, 0)}
    peer = {"num_samples_in": 5.0, "dropped_stale": 0.0, "dropped_no_action_tokens": 1.0}
    peer |= {"num_samples": 4.0, "reward_mean": -1.0, **lags(1, 1, 2)}
    got = counts_over_ranks(TwoRanks(peer), mine)
    # lags of all 6 trained samples: 0, 1, 0, 1, 3, 3 -> mean 8 / 6, max 3
    assert got == {
        "num_samples_in": 8.0,
        "dropped_stale": 1.0,
        "dropped_no_action_tokens": 1.0,
        "num_samples": 6.0,
        **{"policy_lag/0": 2.0, "policy_lag/1": 2.0, "policy_lag/2": 0.0, "policy_lag/3+": 2.0},
        **{"policy_lag/unknown": 0.0, "policy_lag/ahead": 0.0},
        "policy_lag/mean": 8 / 6,
        "policy_lag/max": 3.0,
    }  # reward_mean, a per-sample statistic, is not summed


def test_a_rank_without_lags_gets_the_others_summary_and_no_stale_count_appears() -> None:
    # rank 0 trained nothing with a known version; max_lag unset: no dropped_stale anywhere
    mine = {"num_samples_in": 1.0, "dropped_no_action_tokens": 0.0, "num_samples": 1.0}
    mine |= lags(0, 0, 0, unknown=1)
    peer = {"num_samples_in": 2.0, "dropped_no_action_tokens": 0.0, "num_samples": 2.0}
    peer |= lags(0, 2, 0)
    got = counts_over_ranks(TwoRanks(peer), mine)
    assert "dropped_stale" not in got
    assert got["num_samples"] == 3.0 and got["policy_lag/unknown"] == 1.0
    assert (got["policy_lag/mean"], got["policy_lag/max"]) == (1.0, 1.0)
