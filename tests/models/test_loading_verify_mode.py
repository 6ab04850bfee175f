"""`load_model(verify=...)`, `ludic serve --verify` and `ludic eval --verify`: "sha256" (the
default) refuses a checkpoint whose weights changed in place at the same size (a flipped byte),
naming the file; "size" skips the pass over the weights and loads it (the trade its help states);
a truncated file is refused under both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import tyro
import uvicorn

from ludic.cli import main
from ludic.eval.command import EvalConfig, run_eval_command
from ludic.inference.http.serve_config import ServeConfig
from ludic.inference.http.server import serve
from ludic.models import load_model, load_tiny_model
from ludic.training import CheckpointConfig, CheckpointManager

WEIGHTS = "model/model.safetensors"


@pytest.fixture(scope="module")
def saved_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 1 of the tiny model with its tokenizer, as a run saves it: kept pristine."""
    model, tokenizer = load_tiny_model()
    root = tmp_path_factory.mktemp("runs") / "checkpoints"
    return CheckpointManager(CheckpointConfig(dir=str(root))).save(
        step=1, model=model, tokenizer=tokenizer
    )


@pytest.fixture()
def step(saved_step: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "checkpoints" / saved_step.name
    shutil.copytree(saved_step, copy)
    return copy


def _flip_a_byte(file: Path) -> None:
    """Change one byte inside the tensor data in place: same size, a valid safetensors file."""
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-8])


def test_a_flipped_byte_is_refused_by_default_and_loads_under_size(step: Path) -> None:
    _flip_a_byte(step / WEIGHTS)
    for verify in ({}, {"verify": "sha256"}):
        with pytest.raises(ValueError) as e:
            load_model(step, **verify)  # type: ignore[arg-type]
        message = str(e.value)
        assert WEIGHTS in message and "does not match its sha256" in message, message
    model, _ = load_model(step, dtype="float32", verify="size")
    saved, _ = load_tiny_model()
    loaded = model.state_dict()
    changed = [n for n, t in saved.state_dict().items() if not torch.equal(loaded[n], t)]
    assert len(changed) == 1, changed  # the flipped weights themselves were loaded


@pytest.mark.parametrize("verify", ["sha256", "size"])
def test_a_truncated_file_is_refused_under_both(step: Path, verify: str) -> None:
    _truncate(step / WEIGHTS)
    with pytest.raises(ValueError, match=r"model/model\.safetensors has \d+ bytes, the manifest"):
        load_model(step, verify=verify)  # type: ignore[arg-type]


def test_an_unknown_mode_is_refused_naming_the_choices(step: Path) -> None:
    with pytest.raises(ValueError, match=r"verify must be one of sha256, size .* got 'md5'"):
        load_model(step, verify="md5")  # type: ignore[arg-type]


def test_the_flags_parse_and_default_to_sha256() -> None:
    assert tyro.cli(ServeConfig, args=["--model", "m"]).verify == "sha256"
    assert tyro.cli(ServeConfig, args=["--model", "m", "--verify", "size"]).verify == "size"
    assert tyro.cli(EvalConfig, args=["--env", "tictactoe"]).verify == "sha256"
    assert tyro.cli(EvalConfig, args=["--env", "e", "--verify", "size"]).verify == "size"


@pytest.mark.parametrize("command", [["serve", "--model", "m"], ["eval", "--env", "tictactoe"]])
def test_an_invalid_flag_value_is_refused_naming_the_choices(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--verify", "md5"])
    assert exit_.value.code == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "--verify" in error and "md5" in error and "sha256" in error and "size" in error, error


def test_ludic_serve_loads_as_verify_says(step: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve() hands --verify to the engine: refused by default, served under size (uvicorn's
    run replaced, so serve returns once the model is loaded and the app built)."""
    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(app))
    _flip_a_byte(step / WEIGHTS)
    with pytest.raises(ValueError, match=r"model\.safetensors does not match its sha256"):
        serve(ServeConfig(model=str(step), port=0))  # uvicorn is stubbed: any free port
    assert served == []
    serve(ServeConfig(model=str(step), verify="size", port=0))
    assert len(served) == 1


def test_eval_refuses_verify_with_a_server_url(tmp_path: Path) -> None:
    cfg = EvalConfig(
        env="tictactoe", server_url="http://127.0.0.1:9", verify="size", out_dir=tmp_path
    )
    with pytest.raises(ValueError, match="ludic serve --verify size"):
        run_eval_command(cfg)


def test_ludic_eval_verify_size_evaluates_a_flipped_checkpoint(step: Path) -> None:
    """As a user runs it: a fresh `ludic` process on the step folder."""
    _flip_a_byte(step / WEIGHTS)
    args = ["eval", "--env", "tictactoe", "--model", str(step), "--verify", "size"]
    args += ["--num-problems", "1", "--max-steps", "1", "--max-tokens", "2", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", *args],
        cwd=step.parent,
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (step.parent / "ludic_runs" / "eval" / "metrics.json").is_file()
