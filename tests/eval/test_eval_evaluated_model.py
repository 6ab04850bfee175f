"""`ludic eval` says which model it evaluated: a checkpoint step whose save never finished (no
MANIFEST.json) is refused naming the last complete step, and a complete one is recorded in
run.json (path, step, policy version, manifest digest, sampling), printed, and shown by
`ludic view`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from ludic.eval.command import EvalConfig, run_eval_command
from ludic.training.checkpoint_manifest import write_manifest
from ludic.viz import ViewConfig, view_command


def fake_step(root: Path, step: int, *, complete: bool) -> Path:
    """A checkpoint step folder holding a (fake) model; `complete`: its save wrote a manifest."""
    step_dir = root / f"step_{step:08d}"
    (step_dir / "model").mkdir(parents=True)
    (step_dir / "model" / "config.json").write_text("{}")
    (step_dir / "state.json").write_text(json.dumps({"policy_version": step}))
    if complete:
        write_manifest(step_dir, step)
    return step_dir


def quiz(model: Path, out_dir: Path, **kw: object) -> EvalConfig:
    options: dict[str, object] = {
        "env": "eval_fakes:QuizEnv",
        "model": str(model),
        "num_problems": 1,
        "max_steps": 1,
        "max_tokens": 4,
        "out_dir": out_dir,
        "progress": False,
        **kw,
    }
    return EvalConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", ["", "model"])
def test_an_unfinished_step_is_refused_naming_the_last_complete_one(
    tmp_path: Path, suffix: str
) -> None:
    root = tmp_path / "run" / "checkpoints"
    complete = fake_step(root, 2, complete=True)
    fake_step(root, 3, complete=False)  # complete but damaged: an earlier step that fails
    (root / "step_00000003" / "model" / "config.json").write_text("{} ")
    write_manifest(root / "step_00000003", 3)
    (root / "step_00000003" / "model" / "config.json").write_text("{}")  # size changed
    unfinished = fake_step(root, 4, complete=False)
    out = tmp_path / "eval"
    with pytest.raises(ValueError) as refused:
        run_eval_command(quiz(unfinished / suffix, out), console=Console(width=300))
    message = str(refused.value)
    assert "has no MANIFEST.json, so its save did not finish" in message
    assert f"--model {complete / 'model'}" in message  # step 3 does not verify: step 2
    assert not out.exists()  # refused before anything was written


def test_an_unfinished_step_with_no_complete_one_says_so(tmp_path: Path) -> None:
    unfinished = fake_step(tmp_path / "checkpoints", 4, complete=False)
    with pytest.raises(ValueError, match="no earlier step beside it is complete"):
        run_eval_command(quiz(unfinished, tmp_path / "eval"), console=Console(width=300))


def test_the_evaluated_checkpoint_is_recorded_printed_and_viewed(tmp_path: Path) -> None:
    from ludic.models import tiny_model_dir

    step_dir = tmp_path / "run" / "checkpoints" / "step_00000005"
    shutil.copytree(tiny_model_dir(), step_dir / "model")
    (step_dir / "state.json").write_text(json.dumps({"policy_version": 7}))
    write_manifest(step_dir, 5)
    digest = hashlib.sha256((step_dir / "MANIFEST.json").read_bytes()).hexdigest()
    console = Console(record=True, width=400)
    out = tmp_path / "eval"
    run_eval_command(quiz(step_dir, out, temperature=0.5, top_p=0.9, seed=3), console=console)

    record = json.loads((out / "run.json").read_text())
    assert record["model"] == {
        "path": str(step_dir.resolve()),
        "step": 5,
        "policy_version": 7,
        "manifest_sha256": digest,
    }
    assert record["sampling"] == {"temperature": 0.5, "top_p": 0.9, "max_tokens": 4}
    assert record["seed"] == 3 and record["env"] == "eval_fakes:QuizEnv"
    said = f"step 5, policy version 7, manifest sha256 {digest[:12]}"
    printed = console.export_text()
    assert f"evaluated: {step_dir.resolve()} ({said})" in printed
    assert "temperature 0.5, top-p 0.9, max-tokens 4, seed 3" in printed

    viewer = Console(record=True, width=400)
    page = view_command(ViewConfig(rollouts=out / "rollouts.jsonl"), console=viewer)
    shown = viewer.export_text()
    assert f"ludic eval's episodes of {step_dir.resolve()} ({said})" in shown
    assert f"--tokenizer {step_dir.resolve()}" in shown  # the ids note names it
    assert f"<title>ludic eval: {step_dir.resolve()} ({said})" in page.read_text()

    with pytest.raises(FileExistsError, match=r"run\.json"):  # part of the earlier run's records
        run_eval_command(quiz(step_dir, out), console=console)
