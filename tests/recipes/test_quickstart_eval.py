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
        cfg = tyro.cli(EvalConfig, args=[*argv[2:], "--no-progress"])
        out = cfg.out_dir  # the command names its own, beside the quickstart's evaluations
        assert out == tmp_path / "qs" / "eval" / "again" and cfg.overwrite
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


def test_eval_refuses_batch_invariance_with_a_server_and_bad_threads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ludic serve --batch-invariant"):
        run_eval_command(
            EvalConfig(
                env="tictactoe",
                server_url="http://127.0.0.1:1",
                batch_invariant=True,
                out_dir=tmp_path,
            )
        )
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        run_eval_command(EvalConfig(env="tictactoe", threads=0, out_dir=tmp_path))


def test_the_printed_eval_line_can_be_run_twice(tmp_path: Path) -> None:
    """The quickstart's `ludic eval` line names its own out-dir with --overwrite: `ludic eval`
    refuses an out-dir holding an earlier run's records, and this line is made to be rerun."""
    from ludic.recipes.tictactoe import eval_command

    argv = eval_command({}, "model", episodes=2, temperature=1.0, out_dir=tmp_path / "again")
    cfg = tyro.cli(EvalConfig, args=argv[2:])
    assert cfg.out_dir == tmp_path / "again" and cfg.overwrite
    assert "--out-dir" not in eval_command({}, "model", episodes=2, temperature=1.0)
