"""BUILTIN_ENVS: every name builds a working env, carries its action parser, and plugs into
the RolloutEngine and the eval command's parser resolution."""

from __future__ import annotations

import pytest

from ludic._aio import maybe_await
from ludic.agents import Agent
from ludic.envs import BUILTIN_ENVS, LudicEnv, env_parser, make_env
from ludic.envs.registry import EnvSpec
from ludic.eval.env_spec import resolve_parser
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest

NAMES = {"tictactoe", "tictactoe_duel", "key_door", "guess_number", "math_qa", "memory_corridor"}


async def test_every_builtin_env_builds_and_resets() -> None:
    assert set(BUILTIN_ENVS) >= NAMES
    for name, factory in BUILTIN_ENVS.items():
        env = factory()
        assert isinstance(env, LudicEnv) and isinstance(factory, EnvSpec)
        resets = await maybe_await(env.reset(seed=0))
        assert set(resets) == set(env.agent_ids), name
        assert all(isinstance(obs, str) and obs for obs, _ in resets.values()), name


def test_factories_take_keyword_arguments_and_unknown_names_fail() -> None:
    env = make_env("tictactoe", opponent="random", agent_mark="O")
    assert getattr(env, "opponent", None) == "random"
    assert getattr(make_env("math_qa", limit=5), "dataset", None) is not None
    assert len(make_env("math_qa", limit=5).dataset) == 5  # type: ignore[attr-defined]
    with pytest.raises(KeyError, match="no built-in env 'chess'; choose one of"):
        make_env("chess")
    with pytest.raises(ValueError, match="verifier must be"):
        make_env("math_qa", verifier="fuzzy")


def test_suggested_parsers_match_the_action_formats() -> None:
    for name in ("tictactoe", "tictactoe_duel", "key_door", "guess_number"):
        parser = env_parser(name)
        assert parser is not None and parser("I think <move>5</move>").action == "5"
    boxed = env_parser("math_qa")
    assert boxed is not None and boxed("so \\boxed{42}").action == "42"
    assert env_parser("memory_corridor") is None
    # The eval command's `--parser auto` reads the spec's parser.
    auto = resolve_parser("auto", BUILTIN_ENVS["key_door"])
    assert auto("<move>up</move>").action == "up"


async def test_the_rollout_engine_runs_a_builtin_env_by_name() -> None:
    parser = env_parser("guess_number")
    assert parser is not None

    def protocol() -> SingleAgentProtocol:
        return SingleAgentProtocol(Agent(ScriptedClient(["<move>4</move>"]), parser=parser))

    engine = RolloutEngine(env_registry=BUILTIN_ENVS, protocol_registry={"single": protocol})
    request = RolloutRequest(
        env=ComponentSpec(name="guess_number", kwargs={"max_number": 8}),
        protocol=ComponentSpec(name="single"),
        env_seed=0,
    )
    (rollout,) = await engine.run([request])
    assert "error" not in rollout.meta
    # Guessing 4 forever: the episode ends only if the secret is 4, else max_steps truncates.
    assert [s.action for s in rollout.env_steps][:1] == ["4"]
    assert rollout.env_steps[0].state_key in ("(1, 3)", "(5, 8)", "(4, 4)")
