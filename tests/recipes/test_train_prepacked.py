"""`--prepacked-gemm` where users pick engine settings: `make_inference(prepacked_gemm=True)`,
`ludic train --prepacked-gemm` (in process, and with --local-server handed to its `ludic serve`
child) and `ludic eval --prepacked-gemm`. Flags it cannot go with are refused before any model
loads, naming them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ludic.eval.command import EvalConfig, build_client, run_eval_command
from ludic.models import load_tiny_model, tiny_model_dir
from ludic.recipes import train as train_module
from ludic.recipes.configs import TrainConfig
from ludic.recipes.inference import make_inference
from ludic.recipes.train import train_command
from ludic.recipes.train_local_server import local_server_args

HERE = Path(__file__).parent
RUN_FLAGS = (
    *("--env", "resume_envs:SayOTwiceEnv", "--steps", "2", "--prepacked-gemm"),
    *("--problems-per-step", "2", "--group-size", "2", "--max-steps", "2", "--max-tokens", "6"),
    *("--lr", "3e-2", "--no-progress"),
)
CONFLICTS = [
    (dict(batch_invariant=True), r"--prepacked-gemm and --batch-invariant"),
    (dict(server_url=("http://127.0.0.1:1",)), r"not to --server-url.*ludic serve --prepacked"),
    (dict(device="cuda:0"), r"--prepacked-gemm packs weights for the CPU.*'cuda:0'"),
]


def ludic_train(out_dir: Path, *extra: str) -> str:
    ludic = Path(sys.executable).parent / "ludic"
    head = [str(ludic)] if ludic.exists() else [sys.executable, "-m", "ludic.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    model = tiny_model_dir()
    command = [*head, "train", *RUN_FLAGS, "--model", str(model), "--out-dir", str(out_dir)]
    done = subprocess.run([*command, *extra], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(done.stdout.split())  # rich wraps long lines


def metrics(out_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["in-process", "local-server"])
def test_ludic_train_prepacked_runs_steps(tmp_path: Path, where: str) -> None:
    extra = ("--local-server",) if where == "local-server" else ()
    out = ludic_train(tmp_path / "run", *extra)
    assert "engine: prepacked GEMMs (--prepacked-gemm)" in out
    steps = metrics(tmp_path / "run")
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["num_samples"] > 0 for m in steps)
    if where == "local-server":
        assert "served policy version 2, the trainer's" in out


def test_make_inference_builds_a_packed_engine() -> None:
    model, tokenizer = load_tiny_model()
    for prepacked in (True, False):
        inference = make_inference(model, tokenizer, prepacked_gemm=prepacked)
        try:
            assert inference.client.config.prepacked_gemm is prepacked  # type: ignore[attr-defined]
        finally:
            inference.client.close()  # type: ignore[attr-defined]


PYTHON_CONFLICTS = [  # CONFLICTS as make_inference names them: its arguments, not the flags
    (dict(batch_invariant=True), r"^prepacked_gemm= and batch_invariant="),
    (dict(server_url=("http://127.0.0.1:1",)), r"not to server_url=.*drop prepacked_gemm= here"),
    (dict(device="cuda:0"), r"^prepacked_gemm= packs weights for the CPU.*device= is 'cuda:0'"),
]


@pytest.mark.parametrize(("flags", "words"), PYTHON_CONFLICTS)
def test_make_inference_refuses_conflicts(flags: dict[str, Any], words: str) -> None:
    model, tokenizer = load_tiny_model()
    kwargs: dict[str, Any] = {"server_token": "t", **flags}
    with pytest.raises(ValueError, match=words):
        make_inference(model, tokenizer, prepacked_gemm=True, **kwargs)


@pytest.mark.parametrize(("flags", "words"), CONFLICTS)
def test_ludic_train_refuses_conflicts_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: dict[str, Any], words: str
) -> None:
    def no_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr(train_module, "load_policy", no_load)
    cfg = TrainConfig(env="tictactoe", prepacked_gemm=True, out_dir=tmp_path, **flags)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=words):
        train_command(cfg)


def test_local_server_gets_the_flag() -> None:
    assert local_server_args(TrainConfig(local_server=True, prepacked_gemm=True)) == (
        "--prepacked-gemm",
    )
    assert local_server_args(TrainConfig(local_server=True)) == ()


def test_ludic_eval_builds_a_packed_engine_and_refuses_conflicts(tmp_path: Path) -> None:
    cfg = EvalConfig(env="tictactoe", prepacked_gemm=True, out_dir=tmp_path)
    engine = build_client(cfg, str(tiny_model_dir()))
    try:
        assert engine.config.prepacked_gemm  # type: ignore[attr-defined]
    finally:
        engine.close()  # type: ignore[attr-defined]
    eval_conflicts = [CONFLICTS[0], (dict(server_url="http://127.0.0.1:1"), CONFLICTS[1][1])]
    for flags, words in eval_conflicts:
        bad = EvalConfig(env="tictactoe", prepacked_gemm=True, out_dir=tmp_path, **flags)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=words):
            run_eval_command(bad)
