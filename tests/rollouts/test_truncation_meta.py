"""Training sees truncation (seed 000): terminated, truncated, episode_truncated,
truncation_reason and finish_reason reach every sample, through the real single-agent loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout_fakes import CountEnv, call, env_step, uniform_weights

from ludic.agents import Agent
from ludic.inference.scripted import Reply, ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, build_samples
from ludic.types import Rollout


async def run_samples(replies: Sequence[Reply], *, max_steps: int, **env: Any) -> list[Any]:
    engine = RolloutEngine(
        env_registry={"count": lambda **kw: CountEnv(**kw)},
        protocol_registry={
            "single": lambda **kw: SingleAgentProtocol(
                Agent(ScriptedClient(replies), reject_incomplete_completions=True), **kw
            )
        },
    )
    request = RolloutRequest(
        env=ComponentSpec(name="count", kwargs=env),
        protocol=ComponentSpec(name="single", kwargs={"max_steps": max_steps}),
    )
    (rollout,) = await engine.run([request])
    assert not rollout.failed, rollout.meta
    return build_samples([rollout], uniform_weights([rollout]))


def flags(s: Any) -> tuple[Any, ...]:
    m = s.meta
    return (m["terminated"], m["truncated"], m["episode_truncated"], m["truncation_reason"])


async def test_env_termination() -> None:
    samples = await run_samples(["ok"], max_steps=5, length=2)
    assert [flags(s) for s in samples] == [(False, False, False, None), (True, False, False, None)]
    assert all(s.meta["finish_reason"] == "stop" for s in samples)


async def test_env_truncation() -> None:
    samples = await run_samples(["ok"], max_steps=5, length=2, truncate=True)
    # Only the last turn is truncated; every sample knows the episode was cut, and why.
    assert [flags(s) for s in samples] == [(False, False, True, "env"), (False, True, True, "env")]


async def test_protocol_max_steps_truncation() -> None:
    samples = await run_samples(["ok"], max_steps=3, length=10)
    assert [flags(s) for s in samples] == [
        (False, False, True, "max_steps"),
        (False, False, True, "max_steps"),
        (False, True, True, "max_steps"),
    ]


async def test_llm_length_finish_is_an_incomplete_completion_not_truncation() -> None:
    samples = await run_samples([("half an ans", "length"), "ok"], max_steps=5, length=1)
    cut, done = samples
    assert cut.meta["finish_reason"] == "length"
    assert cut.meta["incomplete_completion"] is True and cut.meta["parse_error"] is True
    assert flags(cut) == (False, False, False, None)
    assert done.meta["incomplete_completion"] is False and done.meta["parse_error"] is False
    assert flags(done) == (True, False, False, None)


def test_last_turn_counts_as_truncated_when_only_the_rollout_meta_says_so() -> None:
    # A protocol that marks max_steps on the rollout but not on a step (or whose last turn is
    # a parse failure without an env step) still yields a truncated final sample.
    r = Rollout(
        steps=[call([1], [2], turn_id="a"), env_step("a"), call([1, 2, 3], [4], turn_id="b")],
        meta={"episode_truncated": True, "truncation_reason": "max_steps"},
    )
    a, b = build_samples([r], uniform_weights([r]))
    assert flags(a) == (False, False, True, "max_steps")
    assert flags(b) == (False, True, True, "max_steps")


def test_an_observed_terminal_outcome_terminates_the_acting_turn() -> None:
    # Multi-agent: the agent moved, then the opponent's move ended the game.
    r = Rollout(
        steps=[
            call([1], [2], turn_id="a"),
            env_step("a"),
            env_step("opp", reward=-1.0, terminated=True),
        ]
    )
    (s,) = build_samples([r], uniform_weights([r]))
    assert s.meta["terminated"] is True and s.meta["reward"] == -1.0
