"""A state key must be an exact identity of the state: a str, an int or a tuple of those. Other
values were turned into their repr without a word, so two different states could share a key
(a numpy array's repr elides its middle) or one state get a new key each time (an object's
default repr holds its address). They are now refused, naming the env's method and the fix."""

from __future__ import annotations

import numpy as np
import pytest

from ludic.agents import Agent
from ludic.envs import state_key_to_str
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Info, StepOutcome


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (None, None),
        ("abc", "abc"),
        (3, "3"),
        ((1, "a", (2, 3)), "(1, 'a', (2, 3))"),
        (np.int64(3), "3"),  # numpy scalars are the number they hold
        ((np.int64(1), np.float32(0.5), np.bool_(True)), "(1, 0.5, True)"),
        # subclasses of float/str/bytes: their numpy repr would give one state another key
        ((np.float64(1.5), np.str_("a"), np.bytes_(b"b")), "(1.5, 'a', b'b')"),
    ],
)
def test_exact_keys_keep_their_canonical_text(key: object, text: str | None) -> None:
    assert state_key_to_str(key) == text  # type: ignore[arg-type]


class NoValueEq:
    pass


@pytest.mark.parametrize(
    ("key", "named"),
    [
        ([1, 2], "list"),
        (np.arange(2000), "ndarray"),  # its repr is "array([0, 1, 2, ..., 1999])"
        (NoValueEq(), "NoValueEq"),  # its repr holds its address
        (frozenset({"a", "b"}), "frozenset"),  # its order varies between processes
        ((1, [2]), "list"),
    ],
)
def test_keys_that_are_not_an_exact_identity_are_refused(key: object, named: str) -> None:
    with pytest.raises(TypeError, match=rf"MyEnv.state_key returned {named}.*tuple\(board\)"):
        state_key_to_str(key, where="MyEnv.state_key")  # type: ignore[arg-type]


class ListKeyEnv(SingleAgentEnv):
    """A grid env that keys its state by the position as a list (a slip for a tuple)."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.position = [0, 0]
        return "You are at 0,0.", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", terminated=True)

    def env_state_key(self) -> list[int]:  # type: ignore[override]
        return self.position


async def test_a_protocol_refuses_a_list_key_naming_the_method() -> None:
    protocol = SingleAgentProtocol(Agent(ScriptedClient(["up"])))
    with pytest.raises(TypeError, match=r"ListKeyEnv\.env_state_key returned list"):
        await protocol.run(ListKeyEnv())
