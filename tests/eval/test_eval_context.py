"""`ludic eval --context` defaults to auto, resolved as `ludic train` resolves it (the env's
`suggested_context`, else full) with the same printed reason; the quickstart's printed
`ludic eval` command states its context, so it reproduces the quickstart's harness."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import tyro
from rich.console import Console

from ludic.eval.command import EvalConfig, run_eval_command
from ludic.recipes.configs import TrainConfig, context_line


def _eval(tmp_path: Path, env: str, **kwargs: object) -> tuple[list[int], str]:
    """Run `ludic eval` on the tiny model for one two-turn episode; return the number of
    prompt messages of each turn and the printed text."""
    from ludic.models import tiny_model_dir

    console = Console(record=True, width=200)
    cfg = EvalConfig(
        env=f"context_envs:{env}",
        model=str(tiny_model_dir()),
        num_problems=1,
        max_steps=2,
        max_tokens=3,
        temperature=0.0,
        out_dir=Path(tempfile.mkdtemp(dir=tmp_path)),  # each call its own: eval refuses reuse
        progress=False,
        **kwargs,  # type: ignore[arg-type]
    )
    result = run_eval_command(cfg, console=console)
    (rollout,) = result.rollouts
    return [len(step.prompt_messages) for step in rollout.agent_steps], console.export_text()


def test_auto_takes_the_envs_suggested_context_and_says_why(tmp_path: Path) -> None:
    prompts, text = _eval(tmp_path, "LatestTwoTurnEnv")
    assert "context: latest (--context auto: the env's suggested_context)" in text
    assert prompts == [1, 1]  # the second prompt holds only the latest observation
    full, text = _eval(tmp_path, "LatestTwoTurnEnv", context="full")
    assert "context: full (--context full)" in text
    assert full == [1, 3]  # observation, reply, observation


def test_auto_is_full_when_the_env_suggests_none(tmp_path: Path) -> None:
    prompts, text = _eval(tmp_path, "TwoTurnEnv")
    assert "context: full (--context auto: the env suggests none)" in text
    assert prompts == [1, 3]


def test_a_bad_suggested_context_names_the_env_and_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"OddContextEnv.*'everything'.*--context full"):
        _eval(tmp_path, "OddContextEnv")
    prompts, _ = _eval(tmp_path, "OddContextEnv", context="latest")  # the flag overrides it
    assert prompts == [1, 1]


def test_eval_and_train_print_the_same_reason_and_default() -> None:
    assert EvalConfig(env="tictactoe").context == TrainConfig().context == "auto"
    line = context_line(EvalConfig(env="tictactoe"), "latest")
    assert line == context_line(TrainConfig(), "latest")


def test_the_quickstarts_eval_command_states_its_context() -> None:
    from ludic.recipes.tictactoe import eval_command

    args = eval_command({}, "some/model", episodes=4, temperature=0.0)
    assert args[:2] == ["ludic", "eval"]
    cfg = tyro.cli(EvalConfig, args=args[2:])
    assert cfg.context == "latest"  # the quickstart's harness (LatestObservationContext)
