"""A checkpoint step without its MANIFEST.json (a save killed before it finished) is refused by
`load_model`, so by `ludic serve` and `ludic train --model` as by `ludic eval`, naming the newest
earlier step that verifies: its weights may be partial, and nothing could say which files are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.models import load_model
from ludic.training.checkpoint_manifest import write_manifest

ADVICE = (
    "so its save did not finish (it was interrupted) and its weights may be partial; {instead}. "
    "A model saved outside a training run loads from a folder of its own: copy its model/ out "
    "of checkpoints/ first"
)


def fake_step(root: Path, step: int, *, complete: bool) -> Path:
    """A checkpoint step folder holding a (fake) model; `complete`: its save wrote a manifest.
    Refused before anything is loaded, so the model need not be a real one."""
    step_dir = root / f"step_{step:08d}"
    (step_dir / "model").mkdir(parents=True)
    (step_dir / "model" / "config.json").write_text("{}")
    (step_dir / "state.json").write_text(json.dumps({"policy_version": step}))
    if complete:
        write_manifest(step_dir, step)
    return step_dir


def damaged_step(root: Path, step: int) -> Path:
    """A complete step whose model no longer matches its manifest: no step to load instead."""
    step_dir = fake_step(root, step, complete=True)
    (step_dir / "model" / "config.json").write_text("{} ")
    return step_dir


@pytest.mark.parametrize("suffix", ["", "model"])
def test_load_model_refuses_an_unfinished_step_naming_the_last_complete_one(
    tmp_path: Path, suffix: str
) -> None:
    root = tmp_path / "run" / "checkpoints"
    complete = fake_step(root, 2, complete=True)
    damaged_step(root, 3)
    unfinished = fake_step(root, 4, complete=False)
    with pytest.raises(ValueError) as refused:
        load_model(unfinished / suffix)
    instead = f"load the last complete step instead: {complete / 'model'}"
    expected = f"{unfinished} has no MANIFEST.json, " + ADVICE.format(instead=instead)
    assert str(refused.value) == expected


def test_an_unfinished_step_with_no_complete_one_says_so(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    damaged_step(root, 1)
    unfinished = fake_step(root, 4, complete=False)
    with pytest.raises(ValueError) as refused:
        load_model(unfinished, verify="size")  # the damaged step's size changed: refused too
    instead = "no earlier step beside it is complete; load another run's checkpoint"
    assert str(refused.value).endswith(ADVICE.format(instead=instead))


def test_a_model_folder_named_model_outside_a_step_is_not_refused_as_unfinished(
    tmp_path: Path,
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("not json")
    with pytest.raises(ValueError) as refused:
        load_model(tmp_path / "model")
    assert "MANIFEST" not in str(refused.value)  # judged as the model it is


@pytest.mark.parametrize("command", ["serve", "train"])
def test_ludic_serve_and_train_refuse_an_unfinished_step(tmp_path: Path, command: str) -> None:
    """The user's command, with the path a killed run leaves as its newest step."""
    root = tmp_path / "run" / "checkpoints"
    complete = fake_step(root, 2, complete=True)
    fake_step(root, 4, complete=False)
    step = "run/checkpoints/step_00000004"
    args = ["--port", "0"] if command == "serve" else ["--out-dir", "out"]
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", command, "--model", step, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"ludic {command}: error: {step} has no MANIFEST.json, so its save" in result.stderr
    assert f"load the last complete step instead: {complete.relative_to(tmp_path)}/model" in (
        result.stderr
    )
    assert not (tmp_path / "out").exists()


def test_a_model_another_tool_saved_in_a_step_named_folder_loads(tmp_path: Path) -> None:
    """A Hugging Face trainer's `.../step_1000` (config.json and weights at its top, no `model/`,
    no `state.json`) is a model, not an interrupted Ludic save: it loads, for `ludic eval` too."""
    import shutil

    from ludic.eval.evaluated_model import refuse_unfinished_checkpoint
    from ludic.models import tiny_model_dir

    model = tmp_path / "hf_outputs" / "step_1000"
    shutil.copytree(tiny_model_dir(), model)
    refuse_unfinished_checkpoint(str(model), verify="size")
    loaded, _ = load_model(model)
    assert loaded.config.num_hidden_layers >= 1
