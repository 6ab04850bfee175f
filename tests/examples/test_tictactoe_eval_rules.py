"""`examples/tictactoe/eval.py` on a quickstart checkpoint plays the quickstart's rules (an
illegal move costs a penalty and the model moves again) and games: run as a program, it gives
the numbers and the very games of the `ludic eval` line the quickstart prints for that
checkpoint. `--illegal-move end` plays the other rule (the first illegal move loses)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from ludic.recipes.configs import QuickstartConfig
from ludic.recipes.quickstart import run_quickstart
from ludic.recipes.tictactoe import quickstart_env_kwargs
from quickstart_games import BUDGET, games

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tictactoe" / "eval.py"


def run(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_examples_default_rules_are_the_quickstarts() -> None:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import eval as example  # examples/tictactoe/eval.py
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    assert example.env_kwargs(example.EvalConfig()) == quickstart_env_kwargs()
    assert quickstart_env_kwargs()["illegal_move"] == "retry"
    end = example.EvalConfig(illegal_move="end", opponent="mixed", opponent_epsilon=0.25)
    assert example.env_kwargs(end) == {
        **quickstart_env_kwargs(),
        "illegal_move": "end",
        "opponent": "mixed",
        "epsilon": 0.25,
    }


@pytest.mark.slow
def test_the_example_gives_the_quickstarts_ludic_eval_line_on_its_checkpoint(
    tmp_path: Path,
) -> None:
    threads = torch.get_num_threads()
    quiet = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    try:
        config = QuickstartConfig(out_dir=tmp_path / "qs", progress=False, **BUDGET)
        run_quickstart(config, console=quiet)
    finally:
        torch.set_num_threads(threads)
        quiet.file.close()
    results = json.loads((tmp_path / "qs" / "results.json").read_text())
    argv = shlex.split(results["eval_command"])
    model = argv[argv.index("--model") + 1]
    after_rl = results["stages"][-1]
    assert 0.0 < after_rl["illegal"] < 1.0  # it makes illegal moves: the rule matters

    cli, example = tmp_path / "cli", tmp_path / "example"
    run("-m", "ludic.cli", *argv[1:], "--out-dir", str(cli), "--no-progress")
    episodes = str(BUDGET["eval_episodes"])
    table = run(str(EXAMPLE), "--model", model, "--episodes", episodes, "--out-dir", str(example))
    assert games(example / "rollouts.jsonl") == games(cli / "rollouts.jsonl")
    assert len(games(example / "rollouts.jsonl")) == BUDGET["eval_episodes"]
    metrics = json.loads((example / "metrics.json").read_text())
    assert metrics == json.loads((cli / "metrics.json").read_text())
    assert metrics["outcome/win"] == pytest.approx(after_rl["win"])
    assert f"{after_rl['win']:.0%}" in table and "illegal moves: retry" in table

    # the other rule: an illegal move ends the game, so other (shorter) games
    end = tmp_path / "end"
    run(
        str(EXAMPLE),
        "--model",
        model,
        "--episodes",
        episodes,
        "--out-dir",
        str(end),
        "--illegal-move",
        "end",
    )
    ended = [json.loads(line) for line in (end / "rollouts.jsonl").read_text().splitlines()]
    illegal = [s for r in ended for s in r["steps"] if s.get("info", {}).get("illegal_move")]
    assert illegal and all(s.get("terminated") for s in illegal)
    assert games(end / "rollouts.jsonl") != games(example / "rollouts.jsonl")
