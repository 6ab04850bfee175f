"""`ludic train --local-server` stopped mid-run (SIGTERM, as a scheduler stops a job) and run
again with `--resume`, each a new process: the stopped run leaves the batch it was training (and
the one drawn ahead) in rollouts.jsonl, untrained; the resume drops them before it writes, so the
logs hold every batch once, in order, each trained by exactly one step; the first batch after
the resume is drawn from the restored weights (the fresh server was pushed them first) and no
sample is more than one version old (README, "Generation in another process, from the command
line")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from combo_processes import ludic, records, run, stop_after_checkpoint

from ludic.models import tiny_model_dir

GROUP, PROBLEMS = 3, 2


def _command(model: Path, steps: int, *extra: str) -> list[str]:
    return ludic(
        *("train", "--env", "combo_say_o:SayOEnv", "--local-server"),
        *("--model", str(model), "--problems-per-step", str(PROBLEMS)),
        *("--group-size", str(GROUP), "--max-steps", "1", "--max-tokens", "8", "--lr", "3e-2"),
        *("--checkpoint-every", "1", "--steps", str(steps), "--out-dir", "run", "--no-progress"),
        *extra,
    )


@pytest.mark.slow
def test_a_stopped_local_server_run_resumes_with_each_batch_trained_once(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    stopped_at = stop_after_checkpoint(_command(model, 200), tmp_path, "run")
    assert stopped_at >= 2
    out = tmp_path / "run"
    left = Counter(r["meta"]["batch_index"] for r in records(out / "rollouts.jsonl"))
    assert max(left) >= stopped_at  # the untrained batch the README says a resume drops
    total = stopped_at + 3
    said = run(_command(model, total, "--resume"), tmp_path)
    assert f"resumed at step {stopped_at} (policy version {stopped_at})" in said
    assert f"served policy version {total}, the trainer's" in said

    metrics = records(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, total + 1))
    rollouts = Counter(r["meta"]["batch_index"] for r in records(out / "rollouts.jsonl"))
    assert rollouts == {batch: PROBLEMS * GROUP for batch in range(total)}, rollouts
    samples = records(out / "samples.jsonl")
    per_batch = Counter(s["meta"]["batch_index"] for s in samples)
    assert sorted(per_batch) == list(range(total))
    assert [per_batch[b] for b in range(total)] == [int(m["num_samples_in"]) for m in metrics]
    for sample in samples:  # trained by step batch + 1, at policy version batch
        lag = sample["meta"]["batch_index"] - min(sample["meta"]["policy_versions"])
        assert 0 <= lag <= 1, sample["meta"]
    first_resumed = [s for s in samples if s["meta"]["batch_index"] == stopped_at]
    assert {min(s["meta"]["policy_versions"]) for s in first_resumed} == {stopped_at}
