"""After a reply that does not parse, the next prompt shows the parser's feedback AND the board
to play on (`current_observation`), in the active observation mode, for the one-agent env (the
quickstart's harness) and the two-seat duel; an env that offers no observation keeps the
feedback alone."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.envs.tictactoe import TicTacToeEnv
from ludic.envs.tictactoe_duel import TicTacToeDuelEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.recipes.tictactoe import protocol_factory
from ludic.types import Message, StepOutcome

FEEDBACK = "Could not find <move>...</move>."


def prompts_of(client: ScriptedClient) -> list[list[Message]]:
    return [list(request.messages) for request in client.requests]


@pytest.mark.parametrize("observation", ["compact", "full"])
async def test_the_harness_shows_feedback_and_the_board_after_an_unparseable_reply(
    observation: str,
) -> None:
    client = ScriptedClient(["I think 5", "<move>5</move>", "<move>1</move>", "<move>9</move>"])
    env = TicTacToeEnv(opponent="random", illegal_move="retry", observation=observation)  # type: ignore[arg-type]
    (rollout,) = await protocol_factory(client)().run(env, env_seed=3)
    first, after_failure = prompts_of(client)[:2]
    board = first[-1]["content"] or ""  # the empty board, as this observation mode draws it
    failed = rollout.env_steps[0]
    assert failed.info["parse_error"] and failed.action is None
    assert failed.next_obs is not None and failed.next_obs.startswith(FEEDBACK)
    assert failed.next_obs.endswith("\n" + board)  # the board again, same mode, same text
    last = after_failure[-1]["content"] or ""
    assert last.startswith(FEEDBACK) and last.endswith(board)
    if observation == "full":
        assert "Legal moves: 1, 2, 3, 4, 5, 6, 7, 8, 9." in last
    else:
        assert last.endswith("1|2|3\n4|5|6\n7|8|9\nX to move")
    assert rollout.env_steps[1].action == "5"  # the game went on from the same board


def test_current_observation_is_the_board_while_the_game_is_on() -> None:
    env = TicTacToeEnv(observation="compact", opponent="random")
    assert env.current_observation(env.agent_id) is None  # before reset
    obs, _ = env.env_reset(seed=0)
    assert env.current_observation(env.agent_id) == obs
    step = env.env_step("10")  # illegal: the game ends (illegal_move="end")
    assert step.terminated and env.current_observation(env.agent_id) is None


async def test_the_duel_shows_the_seat_its_board_after_an_unparseable_reply() -> None:
    move = xml_tag_parser("move")
    x = ScriptedClient(["no move here", "<move>1</move>", "<move>2</move>", "<move>3</move>"])
    o = ScriptedClient(["<move>4</move>", "<move>5</move>"])
    agents = {"X": Agent(x, parser=move), "O": Agent(o, parser=move)}
    env = TicTacToeDuelEnv(observation="compact")
    rollouts = await MultiAgentProtocol(agents).run(env, env_seed=0)
    x_rollout = next(r for r in rollouts if r.agent_id == "X")
    failed = x_rollout.env_steps[0]
    assert failed.info["parse_error"] and failed.action is None
    assert failed.next_obs == f"{FEEDBACK} Reply with your answer inside <move>...</move>.\n" + (
        "1|2|3\n4|5|6\n7|8|9\nX to move"
    )
    assert (prompts_of(x)[1][-1]["content"] or "").endswith("1|2|3\n4|5|6\n7|8|9\nX to move")
    assert x_rollout.env_steps[-1].info["outcome"] == "win"  # X recovered and won
    full = TicTacToeDuelEnv()
    full.reset(seed=0)
    assert "Your turn (X)" in (full.current_observation("X") or "")
    assert "Waiting for X" in (full.current_observation("O") or "")


class Blind(SingleAgentEnv):
    """An env that offers no `current_observation`."""

    def env_reset(self, seed: int | None = None) -> tuple[str, dict[str, object]]:
        return "state", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="next", reward=1.0, terminated=True)


async def test_an_env_without_current_observation_keeps_the_feedback_alone() -> None:
    agent = Agent(ScriptedClient(["nothing", "<move>1</move>"]), parser=xml_tag_parser("move"))
    (rollout,) = await SingleAgentProtocol(agent, max_steps=3).run(Blind(), env_seed=0)
    failed = rollout.env_steps[0]
    assert failed.next_obs == f"{FEEDBACK} Reply with your answer inside <move>...</move>."
