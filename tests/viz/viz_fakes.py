"""Rollouts for viewer tests: real agents and protocols on a guessing game with a ScriptedClient
(multi-turn wins, a parse error, tool calls, a cut-off completion), plus a hand-made context
rewrite (snapshot), a failed episode and text that tries to break out of the page's script."""

from __future__ import annotations

from collections.abc import Sequence

from ludic.agents import Agent, ToolAgent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import IM_END, ScriptedClient, encode_text, render_chatml_ids
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, SAWItem, build_samples
from ludic.types import (
    AgentStep,
    EnvironmentStep,
    Info,
    Message,
    ParseResult,
    Rollout,
    StepOutcome,
    TokenTrace,
)

INJECTION = "</script><script>document.title='PWNED'</script><b>not bold</b>"


class GuessEnv(SingleAgentEnv):
    """Guess the secret number 3. A wrong guess says higher/lower; the right one wins."""

    system_prompt = "Guess the secret number between 0 and 9. Answer as <move>N</move>."

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"Game {seed}: guess a number.", {}

    def env_step(self, action: str) -> StepOutcome:
        if action.strip() == "3":
            return StepOutcome(obs="Correct!", reward=1.0, terminated=True, info={"outcome": "win"})
        hint = "higher" if action.strip() < "3" else "lower"
        return StepOutcome(obs=f"Wrong, go {hint}.", reward=0.0)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first number
        b: second number
    """
    return a + b


TOOL_CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
SCENARIOS: dict[str, tuple[list[str | tuple[str, str]], bool]] = {
    # name: (scripted replies, uses tools)
    "win": (["<move>1</move>", "<move>3</move>"], False),
    "parse": (["I think it is 2", "<move>0</move>"], False),
    "tool": ([TOOL_CALL, "<move>3</move>"], True),
    "cutoff": ([("<move>", "length"), "<move>3</move>"], False),
}


def _protocol(name: str) -> SingleAgentProtocol:
    replies, tools = SCENARIOS[name]
    client = ScriptedClient(replies)
    parser = xml_tag_parser("move")
    if tools:
        agent: Agent = ToolAgent(
            client, tools=[add], parser=parser, system_prompt=f"Use tools. {INJECTION}"
        )
    else:
        agent = Agent(client, parser=parser, reject_incomplete_completions=True)
    return SingleAgentProtocol(agent, max_steps=2)


async def engine_rollouts() -> list[Rollout]:
    engine = RolloutEngine(
        env_registry={"guess": GuessEnv},
        protocol_registry={name: (lambda n=name: _protocol(n)) for name in SCENARIOS},
    )
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="guess"),
            protocol=ComponentSpec(name=name),
            env_seed=i,
            group_id=f"g{i}",
            request_id=f"req-{name}",
        )
        for i, name in enumerate(SCENARIOS)
    ]
    requests.append(
        RolloutRequest(
            env=ComponentSpec(name="guess", kwargs={"bogus": 1}),
            protocol=ComponentSpec(name="win"),
            env_seed=9,
            request_id="req-failed",
        )
    )
    return await engine.run(requests)


def _call(messages: Sequence[Message], completion: str, **kw: object) -> AgentStep:
    return AgentStep(
        turn_id="t0",
        prompt_messages=tuple(messages),
        completion=completion,
        trace=TokenTrace(
            prompt_token_ids=tuple(render_chatml_ids(messages)),
            completion_token_ids=(*encode_text(completion), IM_END),
        ),
        finish_reason="stop",
        **kw,  # type: ignore[arg-type]
    )


def snapshot_rollout() -> Rollout:
    """One turn of two calls; the second prompt replaces the first call's thinking with a
    summary (a context rewrite), so training splits the turn into a snapshot and a final part."""
    system = {"role": "system", "content": GuessEnv.system_prompt}
    first = [system, {"role": "user", "content": "Game 7: guess a number."}]
    second = [system, {"role": "user", "content": "Game 7: guess a number. (notes: try 3)"}]
    think = _call(first, "Let me think about small numbers first.", action_target="internal")
    act = _call(
        second, "<move>3</move>", index=1, loop_index=1, parse_result=ParseResult(action="3")
    )
    env = EnvironmentStep(
        turn_id="t0",
        prev_obs="Game 7: guess a number.",
        action="3",
        next_obs="Correct!",
        reward=1.0,
        terminated=True,
        agent_step_ids=(think.id, act.id),
        info={"outcome": "win"},
    )
    return Rollout(
        id="snapshot-episode",
        steps=[think, act, env],
        meta={"group_id": "g7", "env_seed": 7, "env_name": "guess", "request_id": "req-snap"},
    )


async def all_rollouts() -> list[Rollout]:
    return [*(await engine_rollouts()), snapshot_rollout()]


def advantage_samples(rollouts: Sequence[Rollout]) -> list[SAWItem]:
    """Turn samples weighted by total reward - 0.5 (winners positive, others negative)."""
    ok = [r for r in rollouts if not r.failed]
    weights = {(r.id, t.turn_id): r.total_reward - 0.5 for r in ok for t in r.turns()}
    return build_samples(ok, weights)
