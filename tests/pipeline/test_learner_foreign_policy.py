"""The learner warns, on its step line, when every sample of a step is at policy lag 0 (its
behaviour logprobs should be the learner's own) yet most action tokens were sampled with other
logprobs: the actors sample another model than the learner's `--model` (an embedded actor on
another model trained silently before), or the server returns raw logprobs while they sample at
a temperature other than 1, which the warning names too. Lagged steps and float-noise mismatch
say nothing."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from ludic.pipeline.learner_report import report_step
from ludic.training import mismatch


def _report(metrics: dict[str, float], caplog: pytest.LogCaptureFixture) -> list[str]:
    trainer = SimpleNamespace(step=1, runtime=SimpleNamespace(world_size=1))
    source = SimpleNamespace(rank=0, timed_out=False, timed_out_dropped=0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.learner_report"):
        report_step(trainer, source, {"num_samples": 8.0, **metrics})
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_lag_0_step_sampled_by_another_model_is_named(caplog: pytest.LogCaptureFixture) -> None:
    # what an actor on another tiny model gave a learner on the README's model, step 1
    metrics = {
        "policy_lag/max": 0.0,
        "loss/mismatch/frac_beyond": 0.917,
        "loss/mismatch/abs_log_ratio_mean": 2.632,
    }
    [warning] = _report(metrics, caplog)
    assert warning.startswith(
        "92% of this step's action tokens were sampled with a logprob more than 0.2 from the "
        "learner's recomputation (mean |log ratio| 2.63) although every sample is at policy "
        "lag 0: either the actors sample another model than this learner's --model"
    )
    # raw logprobs (the model's, before temperature) at temperature 0.5 give the same picture
    assert (
        "or the server returns raw logprobs (`ludic serve --logprobs-mode raw`, vLLM "
        "raw_logprobs: before temperature) while the actors sample at a temperature other "
        "than 1 (serve with --logprobs-mode processed, the default, or sample at temperature 1)"
    ) in warning


def test_the_warning_names_the_shared_mismatch_threshold(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mismatch, "MISMATCH_LOG_RATIO_THRESHOLD", 0.3)
    metrics = {"policy_lag/max": 0.0, "loss/mismatch/frac_beyond": 0.9}
    [warning] = _report(metrics, caplog)
    assert "with a logprob more than 0.3 from the learner's recomputation" in warning


@pytest.mark.parametrize(
    "metrics",
    [
        {"policy_lag/max": 0.0, "loss/mismatch/frac_beyond": 0.03},  # bf16 / kernel noise
        {"policy_lag/max": 3.0, "loss/mismatch/frac_beyond": 0.9},  # the policy moved since
        {"policy_lag/max": 0.0},  # no behaviour logprobs: nothing measured
        {"loss/mismatch/frac_beyond": 0.9},  # samples without versions
    ],
)
def test_other_steps_warn_nothing(
    metrics: dict[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    assert _report(metrics, caplog) == []
