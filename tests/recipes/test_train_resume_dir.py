"""`ludic train --resume OTHER/checkpoints/step_X --out-dir D`, where D holds newer steps of
another run, is refused before the model loads, naming those steps and what to do: run anyway,
retention deleted the step it saved and the stale newer ones won a later `--resume`. Once they
are deleted it resumes, and its closing line says which steps this launch trained."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.recipes.configs import RESUME_LATEST, TrainConfig
from ludic.recipes.training import check_resume_dir
from ludic.training.checkpoint_manifest import write_manifest

ENV = """
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class Once(SingleAgentEnv):
    def env_reset(self, seed=None):
        return "Say o.", {}

    def env_step(self, action):
        return StepOutcome(obs="done", reward=float("o" in action), terminated=True)
"""


def ludic_train(cwd: Path, out_dir: str, steps: int, *extra: str) -> subprocess.CompletedProcess:
    """`ludic train` in a new process, on the tiny env in `cwd`."""
    args = ["--env", "resume_dir_env:Once", "--steps", str(steps), "--out-dir", out_dir]
    args += ["--problems-per-step", "1", "--group-size", "2", "--max-tokens", "2"]
    args += ["--max-steps", "1", "--checkpoint-every", "1", "--no-progress", *extra]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        cwd=cwd,
        env={**env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def steps_in(out_dir: Path) -> list[str]:
    return sorted(p.name for p in (out_dir / "checkpoints").iterdir())


@pytest.mark.slow
def test_resuming_below_another_runs_newer_steps_is_refused_then_says_its_steps(
    tmp_path: Path,
) -> None:
    (tmp_path / "resume_dir_env.py").write_text(ENV)
    for out_dir, steps in (("other", 2), ("run", 4)):
        done = ludic_train(tmp_path, out_dir, steps)
        assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    assert steps_in(run) == ["step_00000003", "step_00000004"]
    metrics = (run / "metrics.jsonl").read_text()
    step1 = str(tmp_path / "other" / "checkpoints" / "step_00000001")

    refused = ludic_train(tmp_path, "run", 3, "--resume", step1)
    assert refused.returncode != 0
    text = " ".join((refused.stdout + refused.stderr).split())
    assert "is at step 1" in text and "step_00000003, step_00000004" in text
    assert "rm -r" in text and "another --out-dir" in text
    assert "grpo on" not in refused.stdout  # refused before the model loaded and trained
    assert steps_in(run) == ["step_00000003", "step_00000004"]
    assert (run / "metrics.jsonl").read_text() == metrics

    for stale in ("step_00000003", "step_00000004"):  # as the refusal says
        shutil.rmtree(run / "checkpoints" / stale)
    resumed = ludic_train(tmp_path, "run", 3, "--resume", step1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    closing = " ".join(resumed.stdout.split())
    assert "(step 2) -> " in closing and "(step 3), steps 2-3 of this launch" in closing
    assert "(resumed at step 1)" in closing
    assert steps_in(run) == ["step_00000002", "step_00000003"]  # its own, the last kept
    state = json.loads((run / "checkpoints" / "step_00000003" / "state.json").read_text())
    assert state["step"] == 3


def _checkpoint(root: Path, step: int) -> Path:
    path = root / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"step": step}))
    write_manifest(path, step)  # lists state.json: a manifest that lists nothing verifies nothing
    return path


def test_only_a_resume_older_than_the_out_dirs_checkpoints_is_refused(tmp_path: Path) -> None:
    own = tmp_path / "run" / "checkpoints"
    for step in (3, 4):
        _checkpoint(own, step)
    older = _checkpoint(tmp_path / "other" / "checkpoints", 2)
    newer = _checkpoint(tmp_path / "later" / "checkpoints", 5)

    def check(resume: str | None) -> None:
        cfg = TrainConfig(out_dir=tmp_path / "run", resume=resume)
        check_resume_dir(cfg.out_dir, cfg.resume)

    with pytest.raises(FileExistsError, match="step_00000003, step_00000004"):
        check(str(older))
    with pytest.raises(FileExistsError, match=r"holds newer checkpoints \(step_00000004\)"):
        check(str(own / "step_00000003"))  # the stretch this resume discards
    with pytest.raises(FileExistsError, match="step_00000003"):
        check(str(older.parent))  # a checkpoint root: its newest
    (own / "step_00000005").mkdir()  # a partial save: no resume picks it
    for fine in (RESUME_LATEST, str(own), str(own / "step_00000004"), str(newer), None):
        check(fine)


def test_a_damaged_newer_checkpoint_does_not_block_resuming_an_earlier_one(
    tmp_path: Path,
) -> None:
    """`--resume step_3` where step 3 is damaged is refused naming step 2; `--resume step_2`
    was then refused too, because the damaged step 3 is newer ("a later --resume would pick
    it", which it would not: a bare --resume sets it aside). Only an intact newer one blocks."""
    from ludic.training.checkpoint_manifest import write_manifest

    root = tmp_path / "run" / "checkpoints"
    for step in (2, 3):
        path = root / f"step_{step:08d}"
        path.mkdir(parents=True)
        (path / "state.json").write_text(json.dumps({"step": step}))
        write_manifest(path, step)
    weights = root / "step_00000003" / "state.json"
    weights.write_text(weights.read_text()[:-1])  # truncated after its save: damaged
    check_resume_dir(tmp_path / "run", str(root / "step_00000002"))
    weights.write_text(json.dumps({"step": 3}))  # intact again: it blocks
    with pytest.raises(FileExistsError, match=r"holds newer checkpoints \(step_00000003\)"):
        check_resume_dir(tmp_path / "run", str(root / "step_00000002"))
