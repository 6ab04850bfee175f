"""`ludic train --local-server` sampling at temperature 0.7 / top-p 0.9 under a ratio loss
(CISPO) with `--max-lag 1`, stopped with SIGTERM and resumed, each a new process: the server's
behaviour logprobs follow README "Behaviour logprobs, sampling and importance-sampling
correction" across the restart. Every step whose samples are on-policy (lag 0: the first of the
run, and the first after the resume, drawn from the restored weights pushed to the fresh server)
has its mismatch metrics at float noise and its ratio at 1, with a learning rate large enough
that the initial weights would be far off the checkpoint's; every other step is one version old
and its samples are all counted as such. Every sample records the sampling it was drawn with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from combo_processes import ludic, records, run, stop_after_checkpoint

from ludic.models import tiny_model_dir

NOISE = 5e-3  # README: float32 rounding, up to 1.6e-3 where the top-p boundary moves


def _command(model: Path, steps: int, *extra: str) -> list[str]:
    return ludic(
        *("train", "--env", "combo_say_o:SayOEnv", "--local-server", "--model", str(model)),
        *("--temperature", "0.7", "--top-p", "0.9", "--algorithm", "cispo", "--max-lag", "1"),
        *("--problems-per-step", "2", "--group-size", "3", "--max-steps", "1"),
        *("--max-tokens", "8", "--lr", "3e-2", "--checkpoint-every", "1"),
        *("--steps", str(steps), "--out-dir", "run", "--no-progress", *extra),
    )


def _check_step(metrics: dict[str, Any], on_policy: bool) -> None:
    samples = metrics["num_samples"]
    assert metrics["loss/mismatch/tokens"] == 1.0, metrics
    if not on_policy:
        assert metrics["policy_lag/1"] == samples, metrics
        return
    assert metrics["policy_lag/0"] == samples, metrics
    assert metrics["loss/mismatch/abs_log_ratio_max"] < NOISE, metrics
    assert metrics["loss/mismatch/frac_beyond"] == 0.0, metrics
    assert metrics["loss/mismatch/k3"] < NOISE**2, metrics


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_local_server_top_p_ratio_loss_stays_on_its_samples_across_a_resume(
    tmp_path: Path,
) -> None:
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    stopped_at = stop_after_checkpoint(_command(model, 200), tmp_path, "run")
    total = stopped_at + 2
    said = run(_command(model, total, "--resume"), tmp_path)
    assert f"resumed at step {stopped_at}" in said

    metrics = records(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, total + 1))
    for m in metrics:
        _check_step(m, on_policy=m["step"] in (1, stopped_at + 1))
    # The weights move far in one step: a one-version-old batch shows it, so the initial
    # weights served after the resume would have shown it too.
    assert max(m["loss/mismatch/abs_log_ratio_max"] for m in metrics) > 100 * NOISE
    for sample in records(tmp_path / "run" / "samples.jsonl"):
        assert sample["meta"]["behavior_sampling"] == {
            "temperature": 0.7,
            "top_k": -1,
            "top_p": 0.9,
        }, sample["meta"]
