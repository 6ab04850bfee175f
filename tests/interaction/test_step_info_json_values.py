"""An env's step info must be JSON: numpy values become plain ones where the info enters the
loop, and a value with no plain form fails that episode naming the env, the key and the type.
A numpy array in info used to fail only at the rollout log write ("Object of type ndarray is
not JSON serializable"), naming neither, while the episode trained as if nothing were wrong."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.envs.info_values import jsonable_info
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, read_rollouts_jsonl
from ludic.types import EnvironmentStep, Info, StepOutcome


class InfoEnv(SingleAgentEnv):
    """One step whose info is `info`."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True, info=self.info)


class RawInfoEnv(LudicEnv):
    """The same, as a bare LudicEnv, whose returns the protocol checks."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info

    @property
    def agent_ids(self) -> Sequence[str]:
        return ("p1",)

    @property
    def active_agents(self) -> Sequence[str]:
        return ("p1",)

    def reset(self, seed: int | None = None) -> ResetResult:
        return {"p1": ("go", {})}

    def step(self, actions: Mapping[str, str]) -> StepResult:
        return {"p1": StepOutcome(obs="", reward=1.0, terminated=True, info=self.info)}


NUMPY_INFO = {
    "score": np.float32(0.5),
    "count": np.int64(3),
    "won": np.bool_(True),
    "board": np.array([[1, 0], [0, 2]]),
    "nested": {"probs": [np.float64(0.25)], np.int64(7): "seven"},
}
PLAIN_INFO = {
    "score": 0.5,
    "count": 3,
    "won": True,
    "board": [[1, 0], [0, 2]],
    "nested": {"probs": [0.25], 7: "seven"},
}


def protocol() -> SingleAgentProtocol:
    return SingleAgentProtocol(Agent(ScriptedClient(["move"])), max_steps=1)


@pytest.mark.parametrize("env_class", [InfoEnv, RawInfoEnv])
async def test_numpy_values_reach_the_rollout_as_plain_values(env_class: type) -> None:
    (rollout,) = await protocol().run(env_class(NUMPY_INFO), env_seed=0)
    (step,) = [s for s in rollout.steps if isinstance(s, EnvironmentStep)]
    assert step.info == PLAIN_INFO
    assert type(step.info["score"]) is float and type(step.info["won"]) is bool
    assert type(step.info["count"]) is int and type(step.info["board"][0][0]) is int
    json.dumps(rollout.to_dict())


async def test_a_value_without_a_plain_form_fails_that_episode_only(tmp_path: Path) -> None:
    infos = {"fine": {"score": np.float32(1.0)}, "bad": {"seen": {"a", "b"}}}
    log = tmp_path / "rollouts.jsonl"
    engine = RolloutEngine(
        env_registry={"info": lambda which: InfoEnv(infos[which])},
        protocol_registry={"p": protocol},
        jsonl_log=log,
    )
    requests = [
        RolloutRequest(env=ComponentSpec(name="info", kwargs={"which": which}), protocol=p)
        for which, p in [("fine", ComponentSpec(name="p")), ("bad", ComponentSpec(name="p"))]
    ]
    fine, bad = await engine.run(requests)
    assert not fine.failed and "log_error" not in fine.meta
    assert bad.failed and bad.meta["error_type"] == "TypeError"
    message = bad.meta["error"]
    assert "InfoEnv.env_step returned info['seen']" in message
    assert "(a set)" in message and "sorted(a_set)" in message
    assert [r.failed for r in read_rollouts_jsonl(log)] == [False, True]


def test_json_info_is_returned_as_is() -> None:
    info = {"a": [1, 2.5, "x", None, True], "b": {"c": float("nan")}, 3: (1, 2)}
    assert jsonable_info(info, where="Env.step") is info


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"when": object()}, r"info\['when'\] = <object object at .*> \(a object\)"),
        ({"a": [1, {"b": {1}}]}, r"info\['a'\]\[1\]\['b'\] = \{1\} \(a set\)"),
        ({"a": {(1, 2): "x"}}, r"info\['a'\] with the key \(1, 2\) \(a tuple\).*str\(\.\.\.\)"),
        ({"a": np.array([object()], dtype=object)}, r"info\['a'\]\[0\] = <object"),
    ],
)
def test_a_value_without_a_plain_form_is_named(info: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=r"MyEnv\.step for 'p1' returned " + message):
        jsonable_info(info, where="MyEnv.step for 'p1'")


def test_a_str_enum_key_json_can_write_is_kept() -> None:
    class Key(enum.StrEnum):
        A = "a"

    assert json.dumps(jsonable_info({Key.A: 1}, where="Env.step")) == '{"a": 1}'


def test_an_exception_reads_as_its_type_and_message() -> None:
    """What an env reports under info["critical_error"] (CriticalError's detail reads the same)."""
    info = {"critical_error": RuntimeError("disk on fire")}
    assert jsonable_info(info, where="Env.step") == {"critical_error": "RuntimeError: disk on fire"}


def test_a_value_holding_itself_is_named_not_a_recursion_error() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(TypeError, match=r"Env\.step returned info holding itself \(a circular"):
        jsonable_info({"a": loop}, where="Env.step")
