"""`ludic train` without --resume in an OUT_DIR that holds an earlier run's checkpoints is
refused before the model loads, naming --resume and --out-dir. Run anyway, its final
checkpoint was deleted by retention (the earlier run's newer steps were kept), while the
closing line named it as the model, and its metrics were appended to the earlier run's.
A run resumed from a checkpoint before its last logged step logs those steps again in place
of the discarded ones (metrics.jsonl read 1, 2, 3, 3, 4), in its metrics, rollouts and samples
(the viewer showed the discarded episodes); the later checkpoints must be deleted first."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command
from ludic.training import read_metrics_jsonl

ENV = """
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class Once(SingleAgentEnv):
    def env_reset(self, seed=None):
        return "Say o.", {}

    def env_step(self, action):
        return StepOutcome(obs="done", reward=float("o" in action), terminated=True)
"""


def tiny_run(out_dir: Path, steps: int) -> TrainConfig:
    return TrainConfig(
        env="out_dir_env:Once",
        steps=steps,
        problems_per_step=1,
        group_size=2,
        max_tokens=2,
        max_steps=1,
        checkpoint_every=1,
        out_dir=out_dir,
        progress=False,
    )


@pytest.mark.slow
def test_a_new_run_in_an_earlier_runs_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "out_dir_env.py").write_text(ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert train_command(tiny_run(out, steps=2)).steps == 2
    before = (out / "metrics.jsonl").read_text()

    with pytest.raises(FileExistsError) as refused:
        train_command(tiny_run(out, steps=1))
    text = str(refused.value)
    assert "step_00000002" in text and "--resume" in text and "--out-dir" in text
    assert (out / "metrics.jsonl").read_text() == before  # nothing touched
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_00000001",
        "step_00000002",
    ]

    resumed = train_command(dataclasses.replace(tiny_run(out, steps=3), resume="latest"))
    assert resumed.steps == 1 and resumed.checkpoint.name == "step_00000003"
    assert (resumed.checkpoint / "model").is_dir()
    assert train_command(tiny_run(tmp_path / "other", steps=1)).steps == 1  # a new --out-dir


@pytest.mark.slow
def test_resuming_an_earlier_checkpoint_relogs_its_later_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "out_dir_env.py").write_text(ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    train_command(tiny_run(out, steps=3))
    logged = read_metrics_jsonl(out / "metrics.jsonl")
    episodes, samples = _records(out / "rollouts.jsonl"), _records(out / "samples.jsonl")
    step2 = out / "checkpoints" / "step_00000002"
    resume = dataclasses.replace(tiny_run(out, steps=4), resume=str(step2))
    with pytest.raises(FileExistsError, match="step_00000003"):  # it would outlive this run
        train_command(resume)
    shutil.rmtree(out / "checkpoints" / "step_00000003")
    train_command(resume)
    records = read_metrics_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[:2] == logged[:2] and records[2]["time"] > logged[2]["time"]

    # batch i is step i + 1's: batches 2 and 3 are the resumed run's own, once
    replayed = _records(out / "rollouts.jsonl")
    assert [r["meta"]["batch_index"] for r in replayed] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert replayed[:4] == episodes[:4]
    assert not {r["id"] for r in replayed[4:]} & {r["id"] for r in episodes}
    kept = _records(out / "samples.jsonl")
    assert [s for s in kept if s["meta"]["batch_index"] < 2] == [
        s for s in samples if s["meta"]["batch_index"] < 2
    ]
    assert any(s["meta"]["batch_index"] == 2 for s in samples)  # the discarded step's
    assert {s["meta"]["rollout_id"] for s in kept} <= {r["id"] for r in replayed}
    assert max(s["meta"]["batch_index"] for s in kept) == 3


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
