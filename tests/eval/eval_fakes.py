"""A scripted quiz for eval tests: the env's observation carries a hint, the ScriptedClient
echoes it, so each request decides exactly how its episode is graded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ludic.agents.base import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction.single_agent import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.types import Info, Message, StepOutcome

# Reply -> (reward, outcome label).
GRADES = {"right": (1.0, "right"), "close": (0.5, "close"), "wrong": (0.0, "wrong")}


class QuizEnv(SingleAgentEnv):
    """One question per episode; the reply "right" earns 1, "close" 0.5, anything else 0.
    `hint` is what the scripted model will say."""

    def __init__(self, *, hint: str = "right") -> None:
        self.hint = hint

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"question {seed}; hint={self.hint}", {}

    def env_step(self, action: str) -> StepOutcome:
        reward, label = GRADES.get(action, (0.0, "wrong"))
        return StepOutcome(obs="done", reward=reward, terminated=True, info={"outcome": label})


def echo_hint(messages: Sequence[Message]) -> str:
    return str(messages[-1]["content"]).split("hint=")[1]


def quiz_engine(**kwargs: Any) -> RolloutEngine:
    client = ScriptedClient(echo_hint)
    return RolloutEngine(
        env_registry={"quiz": QuizEnv},
        protocol_registry={"single": lambda: SingleAgentProtocol(Agent(client), max_steps=3)},
        **kwargs,
    )


def quiz_requests(plan: dict[str, list[str]]) -> list[RolloutRequest]:
    """One request per planned reply; problems are groups."""
    return [
        RolloutRequest(
            env=ComponentSpec(name="quiz", kwargs={"hint": hint}),
            protocol=ComponentSpec(name="single"),
            env_seed=p,
            group_id=problem,
            request_id=f"{problem}:{j}",
        )
        for p, (problem, hints) in enumerate(plan.items())
        for j, hint in enumerate(hints)
    ]
