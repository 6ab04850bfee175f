"""A three-turn env trained by GRPO on per-turn samples at `--temperature 0.7` through `ludic
train --local-server`, stopped with SIGTERM mid-run and resumed, then `ludic eval` of the final
checkpoint at that temperature and `ludic view` of both, each a new process (README
"Generation in another process, from the command line", "Checkpoints and resume"): the logs
hold every batch once, its episodes three turns each, and every turn is trained exactly once,
as one sample, at most one version old, drawn at temperature 0.7 (the first batch after the
resume from the restored weights); the evaluation samples every turn at 0.7 from the final
checkpoint's weights, and the viewer shows every episode. Both launches also split each
episode's advantage over its turns (`--split-over-turns`), correct the ratio by truncated
importance sampling (`--rollout-correction.tis-cap 2`) and keep one checkpoint
(`--keep-checkpoints 1`): the resume takes them from the same flags and every step, resumed
ones too, reports the correction."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from combo_processes import agent_steps, ludic, records, run, stop_after_checkpoint

from ludic.models import tiny_model_dir

GROUP, PROBLEMS, TURNS = 2, 2, 3
SHAPE = ("--env", "combo_say_o:SayOThriceEnv", "--max-steps", str(TURNS), "--max-tokens", "6")
# the neighbours a multi-turn run at temperature 0.7 takes with it through a stop and resume
CREDIT = ("--split-over-turns", "--rollout-correction.tis-cap", "2", "--keep-checkpoints", "1")


def _train(model: Path, steps: int, *extra: str) -> list[str]:
    return ludic(
        *("train", *SHAPE, "--local-server", "--model", str(model), "--temperature", "0.7"),
        *("--algorithm", "grpo", "--problems-per-step", str(PROBLEMS)),
        *("--group-size", str(GROUP), "--lr", "3e-2", "--checkpoint-every", "1"),
        *("--steps", str(steps), "--out-dir", "run", "--no-progress", *CREDIT, *extra),
    )


def _check_turns_trained_once(out: Path, total: int, stopped_at: int) -> None:
    episodes = records(out / "rollouts.jsonl")
    per_batch = Counter(r["meta"]["batch_index"] for r in episodes)
    assert per_batch == {batch: PROBLEMS * GROUP for batch in range(total)}, per_batch
    turns = {(r["id"], s["turn_id"]) for r in episodes for s in r["steps"] if s["kind"] == "agent"}
    assert len(turns) == total * PROBLEMS * GROUP * TURNS
    steps = agent_steps(out / "rollouts.jsonl")
    assert {s["trace"]["sampling"]["temperature"] for s in steps} == {0.7}

    samples = records(out / "samples.jsonl")
    assert {s["meta"]["sample_mode"] for s in samples} == {"turn"}
    trained = [(s["meta"]["rollout_id"], s["meta"]["turn_id"]) for s in samples]
    assert sorted(trained) == sorted(turns)  # every turn, once
    for sample in samples:
        assert sample["meta"]["behavior_sampling"]["temperature"] == 0.7, sample["meta"]
        lag = sample["meta"]["batch_index"] - min(sample["meta"]["policy_versions"])
        assert 0 <= lag <= 1, sample["meta"]
    first_resumed = [s for s in samples if s["meta"]["batch_index"] == stopped_at]
    assert {min(s["meta"]["policy_versions"]) for s in first_resumed} == {stopped_at}
    metrics = records(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, total + 1))
    in_batch = Counter(s["meta"]["batch_index"] for s in samples)
    assert [in_batch[b] for b in range(total)] == [int(m["num_samples_in"]) for m in metrics]
    assert all("loss/rollout_is/weight_mean" in m for m in metrics), metrics[-1].keys()
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step_{total:08d}"]


def _check_eval_and_view(cwd: Path, checkpoint: str, version: int) -> None:
    run(
        ludic(
            *("eval", *SHAPE, "--model", checkpoint, "--temperature", "0.7"),
            *("--num-problems", "2", "--samples-per-problem", "2", "--out-dir", "eval"),
            "--no-progress",
        ),
        cwd,
    )
    steps = agent_steps(cwd / "eval" / "rollouts.jsonl")
    assert len(steps) == 4 * TURNS
    assert {s["trace"]["sampling"]["temperature"] for s in steps} == {0.7}
    assert {s["policy_version"] for s in steps} == {version}
    for rollouts, extra in (
        ("run/rollouts.jsonl", ["--samples", "run/samples.jsonl"]),
        ("eval/rollouts.jsonl", []),
    ):
        said = run(
            ludic("view", rollouts, *extra, "--tokenizer", checkpoint, "--out", "v.html"), cwd
        )
        assert "warn" not in said.lower(), said
        html = (cwd / "v.html").read_text()
        assert all(r["id"] in html for r in records(cwd / rollouts)), rollouts


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_multiturn_local_server_run_stopped_resumed_evaluated_and_viewed(tmp_path: Path) -> None:
    model = tiny_model_dir(seed=0, cache_dir=tmp_path / "models")
    stopped_at = stop_after_checkpoint(_train(model, 200), tmp_path, "run")
    assert stopped_at >= 2
    total = stopped_at + 2
    said = run(_train(model, total, "--resume"), tmp_path)
    assert f"resumed at step {stopped_at} (policy version {stopped_at})" in said
    _check_turns_trained_once(tmp_path / "run", total, stopped_at)
    _check_eval_and_view(tmp_path, f"run/checkpoints/step_{total:08d}", total)
