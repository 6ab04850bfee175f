"""Train/inference mismatch metrics and the policy lag histogram, on hand-computed values and
through `accumulate_gradients` (where the Trainer gets them on every step)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from training_fakes import item, mixed_items, tiny_llama

from ludic.training import ReinforceLoss, accumulate_gradients, collate, plan_micro_batches
from ludic.training.logprobs import sequence_logprobs
from ludic.training.mismatch import mismatch_metrics, policy_lag_metrics

TOL = 1e-6


def test_mismatch_metrics_on_hand_computed_log_ratios() -> None:
    # action tokens d = log pi - log mu = [0, 0.5, -0.3] (a 4th token sits in another
    # micro-batch, so shares are over 4):
    #   k3 = sum(e^d - 1 - d) / 4 = (0 + (e^0.5 - 1.5) + (e^-0.3 - 0.7)) / 4
    #   mean |d| = 0.8 / 4,  max |d| = 0.5,  |d| > 0.2: 2 tokens -> 2 / 4,  measured 3 / 4
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    pi = torch.tensor([[0.0, -1.0, -1.5, -2.3, 0.0]])
    mu = torch.tensor([[-9.0, -1.0, -2.0, -2.0, -9.0]])  # off-mask values are ignored
    metrics = mismatch_metrics(pi, mu, mask, total_action_tokens=4.0)
    k3 = (math.exp(0.5) - 1.5) + (math.exp(-0.3) - 0.7)
    assert metrics["mismatch/k3"] == pytest.approx(k3 / 4, abs=TOL)
    assert metrics["mismatch/abs_log_ratio_mean"] == pytest.approx(0.8 / 4, abs=TOL)
    assert metrics["mismatch/abs_log_ratio_max"] == pytest.approx(0.5, abs=TOL)
    assert metrics["mismatch/frac_beyond"] == pytest.approx(0.5, abs=TOL)
    assert metrics["mismatch/tokens"] == pytest.approx(0.75, abs=TOL)
    assert mismatch_metrics(pi, mu, torch.zeros_like(mask), total_action_tokens=4.0) == {}


def test_policy_lag_histogram() -> None:
    # trainer at version 5: lags 0, 1 (oldest token of [4, 5]), 3+ (version 1), 2, unknown, ahead
    items = [
        item(4, versions=[5]),
        item(4, versions=[4, 5]),
        item(4, versions=[1]),
        item(4, versions=[3]),
        item(4),
        item(4, versions=[7]),
    ]
    assert policy_lag_metrics(5, items) == {
        "policy_lag/0": 1.0,
        "policy_lag/1": 1.0,
        "policy_lag/2": 1.0,
        "policy_lag/3+": 1.0,
        "policy_lag/unknown": 1.0,
        "policy_lag/ahead": 1.0,
        "policy_lag/mean": (0 + 1 + 4 + 2) / 4,
        "policy_lag/max": 4.0,
    }


def test_accumulate_gradients_reports_the_mismatch_whatever_the_micro_batch_split() -> None:
    # behaviour = the model's own logprobs, except one action token shifted by 0.3
    model = tiny_llama(seed=1)
    items = mixed_items(5, seed=3)
    with torch.no_grad():
        exact_BT, _ = sequence_logprobs(model, collate(items))
    shifted = []
    for row, sample in enumerate(items):
        lp = [
            float(x) if m else 0.0 for x, m in zip(exact_BT[row], sample.action_mask, strict=False)
        ]
        if row == 2:
            last = max(i for i, m in enumerate(sample.action_mask) if m)
            lp[last] -= 0.3
        shifted.append(replace(sample, behavior_logprobs=tuple(lp)))
    batch = collate(shifted)
    tokens = batch.num_action_tokens
    for budget in (None, 30):
        plan = plan_micro_batches(batch.lengths_B.tolist(), budget)
        metrics = accumulate_gradients(model, ReinforceLoss(), batch, plan).metrics
        model.zero_grad()
        assert metrics["mismatch/abs_log_ratio_max"] == pytest.approx(0.3, abs=1e-5)
        assert metrics["mismatch/abs_log_ratio_mean"] == pytest.approx(0.3 / tokens, abs=1e-5)
        assert metrics["mismatch/frac_beyond"] == pytest.approx(1 / tokens, abs=TOL)
        assert metrics["mismatch/k3"] == pytest.approx((math.exp(0.3) - 1.3) / tokens, abs=1e-5)
        assert metrics["mismatch/tokens"] == pytest.approx(1.0, abs=TOL)


def test_no_mismatch_metrics_without_behaviour_logprobs() -> None:
    model = tiny_llama(seed=1)
    batch = collate([item(6, logprobs=False, seed=s) for s in range(2)])
    metrics = accumulate_gradients(model, ReinforceLoss(), batch, [[0, 1]]).metrics
    assert not any(k.startswith("mismatch/") for k in metrics)
