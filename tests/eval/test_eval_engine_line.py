"""`ludic eval` names its embedded engine's flags before it evaluates, in the words `ludic
actor` logs them (`engine_settings`): `--prepacked-gemm` (or `--batch-invariant`, or default
kernels) is confirmed on the command line, not taken on trust."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ludic.cli import main
from ludic.eval.command import EvalConfig, run_eval_command
from ludic.models import tiny_model_dir

FLAGS = ("--num-problems", "1", "--max-steps", "1", "--max-tokens", "2", "--no-progress")


def squeezed(text: str) -> str:
    """`text` without whitespace (rich wraps long lines, even inside a path)."""
    return "".join(text.split())


def test_ludic_eval_prepacked_gemm_prints_its_engine_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_model_dir()
    head = ["eval", "--env", "eval_fakes:QuizEnv", "--model", str(model), *FLAGS]
    main([*head, "--prepacked-gemm", "--out-dir", str(tmp_path / "packed")])
    text = squeezed(capsys.readouterr().out)
    assert squeezed(f"engine: embedded on {model} (--prepacked-gemm)") in text
    main([*head, "--out-dir", str(tmp_path / "plain")])
    text = squeezed(capsys.readouterr().out)
    assert squeezed(f"engine: embedded on {model} (default kernels)") in text


def test_the_batch_invariant_engine_is_named_too(tmp_path: Path) -> None:
    console = Console(record=True, width=400)
    cfg = EvalConfig(
        env="eval_fakes:QuizEnv",
        model=str(tiny_model_dir()),
        num_problems=1,
        max_steps=1,
        max_tokens=2,
        batch_invariant=True,
        out_dir=tmp_path,
        progress=False,
    )
    run_eval_command(cfg, console=console)
    assert f"engine: embedded on {cfg.model} (--batch-invariant)" in console.export_text()
