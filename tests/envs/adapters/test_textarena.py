"""TextArenaEnv on real TextArena games: one LLM seat against a TextArena opponent, two LLM
seats through MultiAgentProtocol, TextArena's format rules and rewards, a single-player game,
the CLI's `textarena:ID`, and a short GRPO run."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from ludic._aio import maybe_await
from ludic.agents import Agent
from ludic.context.latest_observation import LatestObservationContext
from ludic.envs.adapters.textarena import TextArenaEnv, random_move_opponent
from ludic.eval.env_spec import resolve_env_factory
from ludic.inference import ScriptedClient
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import identity_parser
from ludic.types import Message

pytest.importorskip("textarena", reason="needs textarena: pip install 'ludic[textarena]'")


def first_listed_move(messages: Sequence[Message]) -> str:
    """Plays the lowest cell TextArena lists as available."""
    content = messages[-1]["content"] or ""
    line = [ln for ln in content.splitlines() if ln.startswith("Available Moves")][-1]
    cell = re.findall(r"\[\d\]", line)[0]
    return f"I take {cell}"


def agent(replies: object) -> Agent:
    return Agent(ScriptedClient(replies), context=LatestObservationContext())  # type: ignore[arg-type]


async def test_one_llm_seat_plays_a_textarena_opponent_to_the_end() -> None:
    env = TextArenaEnv("TicTacToe-v0", opponent_seed=0)
    assert env.agent_ids == ("player_0",) and env.num_players == 2
    (rollout,) = await SingleAgentProtocol(agent(first_listed_move), max_steps=9).run(
        env, env_seed=0
    )
    last = rollout.env_steps[-1]
    assert last.terminated and last.reward in (-1.0, 0.0, 1.0)
    assert last.info["textarena_rewards"]["0"] == last.reward  # TextArena's own reward
    assert "Tic Tac Toe" in rollout.env_steps[0].prev_obs  # TextArena's prompt, unchanged
    assert all(s.state_key and '"board"' in s.state_key for s in rollout.env_steps[:-1])


async def test_two_llm_seats_self_play_in_textarena_turn_order() -> None:
    env = TextArenaEnv("TicTacToe-v0", llm_seats=(0, 1))
    agents = {
        "player_0": agent(["[0]", "[1]", "[2]"]),  # player 0 moves first: top row wins
        "player_1": agent(["[3]", "[4]"]),
    }
    rollouts = await MultiAgentProtocol(agents, max_steps=20).run(env, env_seed=0)
    by_seat = {r.env_steps[0].agent_id: r for r in rollouts}
    assert by_seat["player_0"].env_steps[-1].reward == 1.0
    assert by_seat["player_1"].env_steps[-1].reward == -1.0
    assert [s.action for s in by_seat["player_0"].env_steps if s.action] == ["[0]", "[1]", "[2]"]


async def test_textarena_format_rules_give_one_retry_then_the_game_is_lost() -> None:
    env = TextArenaEnv("TicTacToe-v0", llm_seats=(0, 1))
    await maybe_await(env.reset(seed=0))
    out = env.step({"player_0": "no move here"})
    assert not out["player_0"].terminated and env.active_agents == ("player_0",)
    assert "invalid move" in out["player_0"].obs  # TextArena's own message, for another try
    out = env.step({"player_0": "still nothing"})
    assert out["player_0"].terminated and out["player_0"].reward == -1.0
    assert out["player_1"].reward == 1.0 and out["player_0"].info["invalid_move"]


def bisect_guess(messages: Sequence[Message]) -> str:
    """Binary search over TextArena's "higher"/"lower" replies in the whole-game observation."""
    lo, hi, guess = 1, 20, None
    for line in (messages[-1]["content"] or "").splitlines():
        if match := re.fullmatch(r"\[Player\] \[(\d+)\]", line.strip()):
            guess = int(match.group(1))
        elif guess is not None and "is higher" in line:
            lo = guess + 1
        elif guess is not None and "is lower" in line:
            hi = guess - 1
    return f"[{(lo + hi) // 2}]"


async def test_a_single_player_game_has_one_seat_and_textarenas_reward() -> None:
    env = TextArenaEnv("GuessTheNumber-v0")
    assert env.num_players == 1 and env.agent_ids == ("player_0",)
    (rollout,) = await SingleAgentProtocol(agent(bisect_guess), max_steps=10).run(env, env_seed=3)
    assert "Guess The Number" in rollout.env_steps[0].prev_obs
    assert len(rollout.env_steps) <= 5  # 20 numbers: bisection needs at most 5 guesses
    assert rollout.env_steps[-1].terminated and rollout.env_steps[-1].reward == 1.0


def test_random_opponent_picks_a_listed_move() -> None:
    act = random_move_opponent(seed=1)
    assert act("Board\nAvailable Moves: '[2]', '[7]'") in ("[2]", "[7]")
    assert act("no moves listed") == "[pass]"


def test_bad_seats_ids_and_opponents_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="no env 'NoSuchGame-v0'"):
        TextArenaEnv("NoSuchGame-v0")
    with pytest.raises(ValueError, match="llm_seats"):
        TextArenaEnv("TicTacToe-v0", llm_seats=(2,))
    with pytest.raises(ValueError, match="opponent must be"):
        TextArenaEnv("TicTacToe-v0", opponent="minimax")


def test_cli_resolves_textarena_ids_as_single_seat_envs() -> None:
    factory = resolve_env_factory("textarena:TicTacToe-v0")
    # the reply is the action, as in TextArena: declared, so `ludic train` does not suggest one
    assert getattr(factory, "parser", "unset") is identity_parser
    assert factory().agent_ids == ("player_0",)


def test_missing_textarena_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[textarena\]'"):
        TextArenaEnv("TicTacToe-v0")


@pytest.mark.slow
def test_ludic_train_runs_grpo_on_textarena_tictactoe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ludic.recipes.configs import TrainConfig
    from ludic.recipes.train import train_command

    cfg = TrainConfig(
        env="textarena:TicTacToe-v0",
        env_kwargs='{"opponent_seed": 0}',
        context="latest",
        steps=2,
        problems_per_step=1,
        group_size=2,
        max_steps=3,
        max_tokens=6,
        out_dir=tmp_path,
        progress=False,
    )
    result = train_command(cfg)
    assert result.steps == 2 and (result.checkpoint / "model" / "config.json").is_file()
    assert len((tmp_path / "rollouts.jsonl").read_text().splitlines()) == 2 * 1 * 2
    printed = capsys.readouterr().out
    assert "parser: identity_parser" in printed and "declares no parser" not in printed
