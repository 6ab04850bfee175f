"""`ludic eval` on a quickstart checkpoint reproduces the quickstart's own 'after RL' evaluation:
the command the quickstart writes (`results.json["eval_command"]`: the latest board only, the
same games, sampling, batch-invariant engine and threads) gives the same numbers and the same
games, prompt for prompt and token for token."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import tyro
from rich.console import Console

from ludic.eval.command import EvalConfig, run_eval_command
from ludic.recipes.configs import QuickstartConfig
from ludic.recipes.quickstart import run_quickstart
from ludic.recipes.tictactoe import stage_result
from quickstart_games import BUDGET, games


@pytest.mark.slow
def test_ludic_eval_on_the_quickstart_checkpoint_gives_the_quickstarts_numbers(
    tmp_path: Path,
) -> None:
    threads = torch.get_num_threads()
    config = QuickstartConfig(out_dir=tmp_path / "qs", progress=False, **BUDGET)
    quiet = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    try:
        run_quickstart(config, console=quiet)
        results = json.loads((tmp_path / "qs" / "results.json").read_text())
        argv = shlex.split(results["eval_command"])
        assert argv[:4] == ["ludic", "eval", "--env", "tictactoe"] and "latest" in argv
        out = tmp_path / "eval"
        cfg = tyro.cli(EvalConfig, args=[*argv[2:], "--out-dir", str(out), "--no-progress"])
        assert cfg.context == "latest" and cfg.batch_invariant and cfg.system_prompt == ""
        evaluated = run_eval_command(cfg, console=quiet)
        full = replace(cfg, context="full", out_dir=tmp_path / "full")
        run_eval_command(full, console=quiet)
    finally:
        torch.set_num_threads(threads)
        quiet.file.close()
    after_rl = results["stages"][-1]
    assert 0.0 < after_rl["win"] < 1.0 and 0.0 < after_rl["illegal"] < 1.0  # it plays
    assert stage_result("after RL", evaluated).to_dict() == after_rl
    expected = games(tmp_path / "qs" / "eval" / "after_RL" / "rollouts.jsonl")
    assert len(expected) == BUDGET["eval_episodes"]
    assert games(out / "rollouts.jsonl") == expected
    # the whole dialog (ludic eval's default) is another evaluation: other prompts, other games
    assert games(tmp_path / "full" / "rollouts.jsonl") != expected


def test_eval_refuses_batch_invariance_with_a_server_and_bad_threads() -> None:
    with pytest.raises(ValueError, match="ludic serve --batch-invariant"):
        run_eval_command(
            EvalConfig(env="tictactoe", server_url="http://127.0.0.1:1", batch_invariant=True)
        )
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        run_eval_command(EvalConfig(env="tictactoe", threads=0))
