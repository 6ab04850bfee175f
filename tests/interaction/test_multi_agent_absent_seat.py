"""MultiAgentProtocol gives no rollout to a seat that took no part (the episode ended before
it acted or was told anything): an empty rollout used to enter its seat's GRPO group as a
return of 0 nobody earned, moving the advantages of that seat's real episodes, and the batch's
mean reward. End to end through RolloutEngine, generate_batch and GroupNormalizedReturn."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from interaction_fakes import CoinDuelEnv, OneReplyCoinDuelEnv

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, generate_batch
from ludic.training import GroupNormalizedReturn

MOVE = xml_tag_parser("move")


def duel(first_reply: str) -> MultiAgentProtocol:
    first = Agent(ScriptedClient([first_reply]), parser=MOVE)
    second = Agent(ScriptedClient(["<move>1</move>"]), parser=MOVE)
    return MultiAgentProtocol({"first": first, "second": second})


def request(first_reply: str) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="coins"),
        protocol=ComponentSpec(name="duel", kwargs={"first_reply": first_reply}),
        group_id="g",
    )


async def test_a_seat_that_took_no_part_gets_no_rollout_and_no_fake_return() -> None:
    # Episode 1: first's reply does not parse, and this env takes one reply per episode, so
    # the game ends before second is asked or told anything. Episode 2 (2 coins): first takes
    # 1, second takes the last one and wins +1; first gets its -1.
    engine = RolloutEngine(
        env_registry={"coins": lambda: OneReplyCoinDuelEnv(coins=2)},
        protocol_registry={"duel": duel},
    )
    batch = await generate_batch(
        engine,
        [request("junk"), request("<move>1</move>")],
        GroupNormalizedReturn(normalize_std=False),
    )
    by_seat = sorted((r.agent_id, r.meta["request_id"]) for r in batch.rollouts)
    assert [seat for seat, _ in by_seat] == ["first", "first", "second"]
    stopped = next(r for r in batch.rollouts if r.meta.get("seats_without_steps"))
    assert stopped.agent_id == "first" and stopped.meta["seats_without_steps"] == ["second"]
    assert stopped.meta["termination_reason"] == "parse_error"
    assert batch.stats.num_rollouts == 3 and batch.stats.num_failed == 0
    # Second played in one episode of its group: a group of one, advantage 0 (with the empty
    # rollout its returns were [0, +1], and its winning move got +0.5).
    (second,) = [s for s in batch.samples if s.meta["agent_id"] == "second"]
    assert float(second.weight) == 0.0
    # First's two episodes: the parse failure's return and the loss, around their mean.
    first_returns = sorted(r.total_reward for r in batch.rollouts if r.agent_id == "first")
    mean_first = sum(first_returns) / 2
    first_weights = sorted(float(s.weight) for s in batch.samples if s.meta["agent_id"] == "first")
    assert first_weights == pytest.approx([g - mean_first for g in first_returns])
    # The batch's mean reward is over the three rollouts that took part, not four.
    total = sum(r.total_reward for r in batch.rollouts)
    assert batch.stats.mean_reward == pytest.approx(total / 3)


async def test_a_seat_that_only_observed_keeps_its_rollout() -> None:
    # 1 coin: first takes it and wins; second never acts but is told it lost (-1): a real
    # outcome of its seat, which an evaluation counts.
    protocol = duel("<move>1</move>")
    rollouts = await protocol.run(CoinDuelEnv(coins=1), env_seed=0)
    by_seat = {r.agent_id: r for r in rollouts}
    assert set(by_seat) == {"first", "second"}
    assert by_seat["second"].agent_steps == [] and by_seat["second"].total_reward == -1.0
    assert all("seats_without_steps" not in r.meta for r in rollouts)


class NobodyMovesEnv(CoinDuelEnv):
    @property
    def active_agents(self) -> Sequence[str]:
        return ()


async def test_an_episode_in_which_no_seat_took_part_is_an_error_naming_the_env() -> None:
    with pytest.raises(ValueError, match=r"NobodyMovesEnv: no seat acted or observed anything"):
        await duel("<move>1</move>").run(NobodyMovesEnv(), env_seed=0)
