"""A reply that does not parse leaves the env's state unchanged, and GiGPO keeps that turn in
its state's anchor group, by design: an unparseable reply is one more action taken from that
state, whose return-to-go is the parser's penalty plus the discounted return of the retry.
So the failed turn ranks below the valid actions taken from the same state, and the retry
ranks as a first-try valid action with the same outcome. Excluding failure turns (A_S = 0)
would drop exactly that comparison; two failures in a row from one state still rank by
position (the earlier one's return holds the later one's penalty), which is the Monte Carlo
return of each, not a tie-break."""

from __future__ import annotations

import math

import pytest
from interaction_fakes import CountingEnv

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.training import GiGPO
from ludic.types import Rollout


class KeylessEnv(CountingEnv):
    """The same game without a state key: anchors are the observation text."""

    def env_state_key(self) -> None:  # type: ignore[override]
        return None


async def episode(env_class: type[CountingEnv], *replies: str) -> Rollout:
    agent = Agent(ScriptedClient(list(replies)), parser=xml_tag_parser("move"))
    (rollout,) = await SingleAgentProtocol(agent, max_steps=3).run(env_class(length=1))
    rollout.meta["group_id"] = "g"
    return rollout


@pytest.mark.parametrize("env_class", [CountingEnv, KeylessEnv])
async def test_a_parse_failure_competes_with_the_valid_actions_from_its_state(
    env_class: type[CountingEnv],
) -> None:
    retried = await episode(env_class, "no tags", "<move>good</move>")  # -1 (penalty), then 1
    first_try = await episode(env_class, "<move>good</move>")  # 1
    wrong = await episode(env_class, "<move>bad</move>")  # 0
    # the failure left state 0 (and its observation) as it was
    assert len({(t.state_key, t.observation) for t in retried.turns()}) == 1
    credit = GiGPO(gamma=0.5, normalize_std=False, step_normalize_std=False)
    details = credit.details([retried, first_try, wrong])
    failed, retry = (details[(retried.id, t.turn_id)] for t in retried.turns())
    (valid,) = (details[(first_try.id, t.turn_id)] for t in first_try.turns())
    (bad,) = (details[(wrong.id, t.turn_id)] for t in wrong.turns())
    # Returns-to-go from state 0: failed -1 + 0.5 * 1 = -0.5, retry 1, valid 1, bad 0;
    # mean 0.375, so A_S = -0.875, 0.625, 0.625, -0.375 (one anchor group of 4).
    # Episode returns 0, 1, 0: mean 1/3, A_E = -1/3, 2/3, -1/3; A = A_E + A_S.
    assert [c.anchor_group_size for c in (failed, retry, valid, bad)] == [4, 4, 4, 4]
    expected_step = [-0.875, 0.625, 0.625, -0.375]
    expected_episode = [-1 / 3, -1 / 3, 2 / 3, -1 / 3]
    for c, a_s, a_e in zip(
        (failed, retry, valid, bad), expected_step, expected_episode, strict=True
    ):
        assert math.isclose(c.step_advantage, a_s, abs_tol=1e-9)
        assert math.isclose(c.advantage, a_e + a_s, abs_tol=1e-9)
