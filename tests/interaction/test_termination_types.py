"""Termination settings of the wrong type are refused where they are written, naming the
setting: `max_steps="3"` failed with "'<' not supported between 'str' and 'int'", `2.5` was
accepted and failed every episode in `range`, `True` ran one step, and
`TerminateAction(actions="stop")` ended the episode on the actions "s", "t", "o" and "p"."""

from __future__ import annotations

import numpy as np
import pytest

from ludic.agents import Agent
from ludic.inference import ScriptedClient
from ludic.interaction import (
    ContextBudget,
    CriticalError,
    MaxSteps,
    MultiAgentProtocol,
    SingleAgentProtocol,
    TerminateAction,
)


def agent() -> Agent:
    return Agent(ScriptedClient(["x"]))


@pytest.mark.parametrize("bad", ["3", 2.5, True, 3.0])
def test_a_max_steps_that_is_not_an_int_is_a_type_error_naming_it(bad: object) -> None:
    with pytest.raises(TypeError, match=r"SingleAgentProtocol max_steps must be an int, got"):
        SingleAgentProtocol(agent(), max_steps=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"MultiAgentProtocol max_steps must be an int, got"):
        MultiAgentProtocol({"agent_0": agent()}, max_steps=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"MaxSteps.max_steps must be an int, got"):
        MaxSteps(max_steps=bad)  # type: ignore[arg-type]


def test_counts_of_the_other_rules_are_checked_the_same_way() -> None:
    with pytest.raises(TypeError, match=r"ContextBudget.max_tokens must be an int, got str"):
        ContextBudget(max_tokens="4096")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"max_consecutive_parse_errors must be an int"):
        CriticalError(max_consecutive_parse_errors=2.0)  # type: ignore[arg-type]


def test_an_integer_of_any_kind_is_still_accepted() -> None:
    protocol = SingleAgentProtocol(agent(), max_steps=np.int64(3))  # type: ignore[arg-type]
    assert protocol.max_steps == 3
    assert MaxSteps(max_steps=np.int32(2)).max_steps == 2


def test_terminate_action_refuses_a_bare_string_of_actions() -> None:
    with pytest.raises(TypeError, match=r"pass actions=\('stop',\)"):
        TerminateAction(actions="stop")  # type: ignore[arg-type]
    assert TerminateAction(actions=("stop",)).actions == ("stop",)
