"""Agent arguments of the wrong kind are refused at construction, naming the fix (a context
strategy's class, a string, a dict of sampling fields and a client class were accepted and
failed every episode with an AttributeError naming none of them), and a parser that returns
something other than a ParseResult is a parse failure saying so (as a raising parser is),
not an episode that crashes."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig, ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Info, StepOutcome


def client() -> ScriptedClient:
    return ScriptedClient(["42"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context": FullDialog}, r"ContextStrategy instance .* got the class FullDialog"),
        ({"context": "full"}, r"ContextStrategy instance .* got str 'full'"),
        ({"sampling": {"max_tokens": 10}}, r"sampling must be a SamplingConfig .* got dict"),
    ],
)
def test_a_context_or_sampling_of_the_wrong_kind_is_refused(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        Agent(client(), **kwargs)  # type: ignore[arg-type]


def test_a_client_class_is_refused_asking_for_an_instance() -> None:
    with pytest.raises(TypeError, match=r"got the class ScriptedClient; pass ScriptedClient\("):
        Agent(ScriptedClient)  # type: ignore[arg-type]


def test_instances_are_accepted() -> None:
    agent = Agent(client(), context=FullDialog(), sampling=SamplingConfig(max_tokens=4))
    assert agent.sampling.max_tokens == 4


class Once(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "answer", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True)


async def test_a_parser_returning_the_action_text_is_a_parse_failure_naming_it() -> None:
    agent = Agent(client(), parser=lambda text: text.strip())  # type: ignore[arg-type,return-value]
    (rollout,) = await SingleAgentProtocol(agent, max_steps=2).run(Once(), env_seed=0)
    steps = rollout.agent_steps
    assert len(steps) == 2 and all(s.info["parse_error"] for s in steps)
    assert steps[0].info["parser_exception"] == (
        "TypeError: the parser returned str '42', not a ParseResult; "
        "return ParseResult(action=..., reward=..., obs=...)"
    )
    assert rollout.meta["termination_reason"] == "max_steps"
