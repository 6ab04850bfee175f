"""A context strategy that rewrites history without `mark_rewrite()` is told so.

README ("Snapshots and template drift"): a custom strategy that rewrites must call
`mark_rewrite()`. One that forgets keeps its history version, so its edits were counted as
template drift (no snapshot, `snapshot_policy` unused) without a word. The sample builder now
warns once, naming the fix; a marked edit and a true drift (the messages still extend) stay
silent, and the cut itself is unchanged.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from rollout_fakes import call

from ludic._log_once import forget_warnings
from ludic.agents import Agent
from ludic.context import ContextStrategy
from ludic.envs import TicTacToeEnv, env_parser
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts.stitching import stitch_traces
from ludic.types import Message, Rollout

LOGGER = "ludic.rollouts.stitching"


class LatestOnly(ContextStrategy):
    """Shows only the latest user message: a rewrite from the second turn on."""

    def __init__(self, *, mark: bool) -> None:
        super().__init__()
        self.mark = mark

    def on_before_act(self) -> list[Message]:
        users = [i for i, m in enumerate(self._messages) if m["role"] == "user"]
        return self.messages[users[-1] :]

    def on_after_step(self, next_obs: str | None, info: dict) -> None:
        if self.mark and next_obs is not None:
            self.mark_rewrite()
        super().on_after_step(next_obs, info)


def play(*, mark: bool) -> Rollout:
    replies = ["<move>5</move>", "<move>1</move>", "<move>9</move>", "<move>3</move>"]
    agent = Agent(
        ScriptedClient(replies), parser=env_parser("tictactoe"), context=LatestOnly(mark=mark)
    )
    env = TicTacToeEnv(opponent="random", illegal_move="retry")
    (rollout,) = asyncio.run(SingleAgentProtocol(agent, max_steps=4).run(env, env_seed=0))
    return rollout


def stitch(steps) -> list[str]:
    return [s.end for s in stitch_traces(steps, [s.trace for s in steps])]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    forget_warnings()
    yield
    forget_warnings()


def test_an_unmarked_rewrite_warns_once_and_stays_a_drift_split(caplog) -> None:
    rollout = play(mark=False)
    assert len(rollout.agent_steps) >= 3
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ends = stitch(rollout.agent_steps)
    assert ends[:-1] == ["drift"] * (len(ends) - 1)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, warnings
    assert "mark_rewrite()" in warnings[0] and "agent_0" in warnings[0]


def test_a_marked_rewrite_is_a_silent_snapshot(caplog) -> None:
    rollout = play(mark=True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ends = stitch(rollout.agent_steps)
    assert ends[:-1] == ["edit"] * (len(ends) - 1) and len(ends) >= 3
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_template_drift_of_an_append_only_history_is_silent(caplog) -> None:
    # Same version, and the second prompt's messages extend the first's: the tokens drifted
    # (a template re-rendered the reply), the strategy did nothing wrong.
    first: tuple[Message, ...] = ({"role": "user", "content": "hi"},)
    second = (*first, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"})
    steps = [
        call([1, 2], [3], target="internal", prompt_messages=first, info={"context_version": 0}),
        call([1, 2, 9, 4], [5], prompt_messages=second, info={"context_version": 0}),
    ]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert stitch(steps) == ["drift", "end"]
    assert not [r for r in caplog.records if r.name == LOGGER]
