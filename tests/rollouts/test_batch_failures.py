"""A batch that trains on nothing says so: every episode failed -> one loud log line naming
the first error; cut-off replies (and the ones rejected unparsed) are counted in BatchStats."""

from __future__ import annotations

import logging

import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, generate_batch
from ludic.types import Info, Rollout, StepOutcome


class OneTurn(SingleAgentEnv):
    def __init__(self, broken: bool = False) -> None:
        if broken:
            raise NameError("name 'client' is not defined")

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True)


class Uniform:
    def assign(self, rollouts: list[Rollout]) -> dict[tuple[str, str], float]:
        return {(r.id, t.turn_id): 1.0 for r in rollouts for t in r.turns()}


def engine(replies: list[str | tuple[str, str]], *, reject: bool) -> RolloutEngine:
    def protocol() -> SingleAgentProtocol:
        agent = Agent(
            ScriptedClient(list(replies)),
            parser=xml_tag_parser("move"),
            reject_incomplete_completions=reject,
        )
        return SingleAgentProtocol(agent, max_steps=1)

    return RolloutEngine(env_registry={"one": OneTurn}, protocol_registry={"p": protocol})


def requests(n: int, **env_kwargs: object) -> list[RolloutRequest]:
    spec = ComponentSpec(name="one", kwargs=dict(env_kwargs))
    return [RolloutRequest(env=spec, protocol=ComponentSpec(name="p")) for _ in range(n)]


async def test_every_episode_failing_is_logged_loudly_with_the_first_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="ludic.rollouts.engine"):
        batch = await generate_batch(
            engine(["<move>1</move>"], reject=False), requests(3, broken=True), Uniform()
        )
    assert batch.stats.num_failed == 3 and batch.samples == []
    (record,) = [r for r in caplog.records if "every one of the 3 episodes" in r.message]
    assert record.levelno == logging.ERROR
    assert "env_factory, NameError" in record.message
    assert "name 'client' is not defined" in record.message


async def test_a_partly_failed_batch_is_not_reported_as_all_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="ludic.rollouts.engine"):
        mixed = requests(2) + requests(1, broken=True)
        await engine(["<move>1</move>"], reject=False).run(mixed)
    assert "every one of" not in caplog.text


@pytest.mark.parametrize("reject", [False, True])
async def test_cut_off_replies_and_rejections_are_counted(reject: bool) -> None:
    replies: list[str | tuple[str, str]] = [("<move>1</move> and th", "length")]
    batch = await generate_batch(engine(replies, reject=reject), requests(2), Uniform())
    stats = batch.stats
    assert stats.num_incomplete == 2
    assert stats.num_incomplete_rejected == (2 if reject else 0)
    # Not rejected, the user's parser read the cut-off reply and the env got the move.
    assert stats.mean_reward == (pytest.approx(-1.0, abs=1.0) if reject else 1.0)
    assert batch.stats.to_dict()["num_incomplete"] == 2


async def test_a_batch_that_all_timed_out_says_why_and_the_way_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen in the README's evaluation block on a loaded 2-core box: 64 episodes in flight on
    one model, each timed out (each lasts about as long as all of them)."""
    from tests.rollouts.test_rollout_engine import Harness, req

    hung = [req(i, hang_at=0) for i in range(2)]
    with caplog.at_level(logging.ERROR, logger="ludic.rollouts.engine"):
        await Harness().engine(episode_timeout_s=0.05).run(hung)
    (record,) = [r for r in caplog.records if "every one of the 2 episodes" in r.message]
    assert "(timeout, TimeoutError)" in record.message
    assert "counts each episode from its start" in record.message
    assert "a larger episode_timeout_s (or None) or a smaller concurrency" in record.message
