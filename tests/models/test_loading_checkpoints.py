"""The path a run prints for its checkpoint (`.../checkpoints/step_N`, no `/model`) loads as a
model and as a tokenizer: `load_model` / `load_tokenizer` use its `model/`. A run folder (many
checkpoints) is refused naming the latest one's `model/`; a missing path says "no model
directory at PATH", not that Ludic never downloads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.models import load_model, load_tiny_model, load_tokenizer, model_directory
from ludic.recipes.training import finish, make_trainer
from ludic.training import SAWBatch
from ludic.training.algorithm import make_sft

TEXT = "<move>4</move> looks good"


class NoBatches:
    """A source never drawn from: the run saves its step-0 checkpoint and stops."""

    async def next_batch(self) -> SAWBatch:
        raise AssertionError("not drawn")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with one checkpoint, saved the way `ludic train` / `ludic sft` save."""
    out = tmp_path_factory.mktemp("runs") / "x"
    model, tokenizer = load_tiny_model()
    trainer = make_trainer(model, tokenizer, make_sft(), NoBatches(), out=out, lr=1e-3)
    step_dir = finish(trainer)
    assert step_dir == out / "checkpoints" / "step_00000000"
    return out


def test_a_checkpoint_step_folder_loads_its_model(run: Path) -> None:
    step_dir = run / "checkpoints" / "step_00000000"
    assert model_directory(step_dir) == step_dir / "model"
    model, tokenizer = load_model(step_dir)
    reference, ref_tokenizer = load_model(step_dir / "model")
    assert tokenizer.encode(TEXT) == ref_tokenizer.encode(TEXT)
    for (name, p), (_, q) in zip(
        model.state_dict().items(), reference.state_dict().items(), strict=True
    ):
        assert p.equal(q), name
    assert Path(model.config._name_or_path) == step_dir / "model"


def test_a_checkpoint_step_folder_loads_its_tokenizer(run: Path) -> None:
    step_dir = run / "checkpoints" / "step_00000000"
    assert load_tokenizer(step_dir).encode(TEXT) == load_tokenizer(step_dir / "model").encode(TEXT)


@pytest.mark.parametrize("where", ["", "checkpoints"])
def test_a_run_folder_names_its_latest_checkpoint(run: Path, where: str) -> None:
    latest = run / "checkpoints" / "step_00000000" / "model"
    with pytest.raises(
        FileNotFoundError, match=f"holds checkpoints, not one model: .*{re.escape(str(latest))}"
    ):
        load_model(run / where)
    with pytest.raises(FileNotFoundError, match=f"not one tokenizer: .*{re.escape(str(latest))}"):
        load_tokenizer(run / where)


def test_missing_and_non_model_paths_say_what_they_are(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError, match=re.escape("no model directory at Qwen/Qwen3-0.6B")
    ) as info:
        load_model("Qwen/Qwen3-0.6B")
    assert "download" not in str(info.value)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path} is not a model directory")):
        load_model(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"no tokenizer directory at {tmp_path / 'no'}")
    ):
        load_tokenizer(tmp_path / "no")


def ludic(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_ludic_eval_and_view_take_the_printed_checkpoint_path(run: Path, tmp_path: Path) -> None:
    """`ludic eval --model runs/x/checkpoints/step_N` runs, and `ludic view --tokenizer` with
    the same folder decodes (the path Ctrl-C and closing lines print)."""
    step_dir = run / "checkpoints" / "step_00000000"
    result = ludic(
        "eval",
        "--env",
        "guess_number",
        "--model",
        step_dir,
        "--num-problems",
        "1",
        "--max-steps",
        "2",
        "--max-tokens",
        "8",
        "--no-progress",
        "--out-dir",
        tmp_path / "ev",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rollouts = tmp_path / "ev" / "rollouts.jsonl"
    view = ludic("view", rollouts, "--tokenizer", step_dir, cwd=tmp_path)
    assert view.returncode == 0, view.stderr[-2000:]
    assert (tmp_path / "ev" / "rollouts.html").is_file()


def test_serve_reads_a_checkpoint_step_folders_saved_dtype(tmp_path: Path) -> None:
    """`ludic serve --model .../step_N --prepacked-gemm` checks the dtype of its `model/`."""
    from ludic.inference.http.serve_config import ServeConfig, check_serve_config

    model_dir = tmp_path / "checkpoints" / "step_00000004" / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text('{"dtype": "float16"}', encoding="utf-8")
    with pytest.raises(ValueError, match="would load as float16"):
        check_serve_config(ServeConfig(model=str(model_dir.parent), prepacked_gemm=True))
