"""One agent turn with external tool round trips, shared by every protocol."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

from ludic._aio import call_off_loop
from ludic._describe import describe_value
from ludic._log_once import warn_once
from ludic.agents.base import Agent, AgentAct
from ludic.agents.tools import ToolResultTypeError
from ludic.inference.sampling import SamplingConfig
from ludic.sandbox.records import SandboxStartError
from ludic.types import AgentStep, Info, ToolCall, ToolResult

logger = logging.getLogger(__name__)

ExternalToolHandler = Callable[
    [Sequence[ToolCall], "ToolCallContext"],
    Awaitable[Sequence[ToolResult]] | Sequence[ToolResult],
]
"""`handler(calls, ctx)` -> one `ToolResult` per call. An `async def` runs on the event loop; a
plain function on a worker thread (so a blocking one holds only its own episode)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallContext:
    """Where an external tool call came from (used to link child rollouts to parents)."""

    rollout_id: str
    agent_id: str
    turn_id: str
    agent_step_id: str
    sampling: SamplingConfig | None


def _error_results(calls: Sequence[ToolCall], message: str) -> list[ToolResult]:
    return [
        ToolResult(tool_call_id=c.id, name=c.name, is_error=True, content=f"Error: {message}")
        for c in calls
    ]


async def act_with_tools(
    agent: Agent,
    *,
    turn_id: str,
    sampling: SamplingConfig | None,
    step_info: Info,
    rollout_id: str,
    handler: ExternalToolHandler | None,
    max_external_calls: int,
) -> AgentAct:
    """Let the agent act; route external tool calls through `handler` and feed the results
    back until it gives a final action. Returns one AgentAct holding every model call of the
    turn, their `loop_index` numbered 0, 1, ... across the whole turn. A missing or failing
    handler yields error results the agent sees (a handler's result of the wrong shape or that
    JSON cannot hold fails the episode instead: `ToolResultTypeError`); too many round trips
    end the turn as a parse failure (`Agent.give_up`)."""
    steps: list[AgentStep] = []
    for _ in range(max_external_calls + 1):
        act = await agent.act(turn_id=turn_id, sampling=sampling, step_info=step_info)
        steps.extend(
            dataclasses.replace(s, loop_index=len(steps) + i) for i, s in enumerate(act.steps)
        )
        if not act.external_calls:
            return dataclasses.replace(act, steps=tuple(steps))
        ctx = ToolCallContext(
            rollout_id=rollout_id,
            agent_id=agent.agent_id,
            turn_id=turn_id,
            agent_step_id=act.final_step.id,
            sampling=sampling,
        )
        results = await _handle_external(handler, act.external_calls, ctx)
        agent.on_tool_results(results)
        steps[-1] = dataclasses.replace(steps[-1], tool_results=(*steps[-1].tool_results, *results))
    return agent.give_up(
        steps,
        f"You made {max_external_calls + 1} external tool calls without a final answer. "
        "Give your final answer now.",
    )


async def _handle_external(
    handler: ExternalToolHandler | None, calls: Sequence[ToolCall], ctx: ToolCallContext
) -> list[ToolResult]:
    """The handler's result for each call; a missing or failing handler gives error results
    the model reads. A result of the wrong shape or one JSON cannot hold (`ToolResultTypeError`)
    is the handler's bug, not the model's, and a sandbox that never started
    (`SandboxStartError`) the host's failure: they fail the episode, as an env's step info JSON
    cannot hold does."""
    if handler is None:
        return _error_results(calls, "no handler for external tools in this protocol")
    try:
        returned = await call_off_loop(handler, calls, ctx)
    except ToolResultTypeError:  # e.g. tool_results_from_json inside the handler
        raise
    except SandboxStartError as exc:
        raise SandboxStartError(f"external_tool_handler {_name(handler)}: {exc}") from exc
    except Exception as exc:  # a failing handler is a tool error, not a crash
        _report(handler, exc)
        return _error_results(calls, f"{type(exc).__name__}: {exc}")
    return _match_results(calls, returned, handler)


_SHAPE = (
    "return one ToolResult per call (ludic.agents.tool_results_from_json pairs plain outputs "
    "with their calls)"
)


def _name(handler: object) -> str:
    return getattr(handler, "__qualname__", type(handler).__name__)


def _report(handler: object, exc: Exception) -> None:
    """Log a handler failure once per handler and exception type: the model sees it as an
    error result, and so should whoever wrote the handler (a bug there fails every call)."""
    message = f"{type(exc).__name__}: {exc}"
    name = _name(handler)
    warn_once(
        logger,
        ("handler", name, type(exc).__name__),
        "external_tool_handler %s failed: %s (given to the model as the tool result)",
        name,
        message,
    )


def _match_results(calls: Sequence[ToolCall], results: object, handler: object) -> list[ToolResult]:
    """One result per call, in call order; a call the handler left unanswered gets an error
    (the model must see a reply to every tool call it made). A result that is no list of
    ToolResult raises `ToolResultTypeError` naming `handler` and what it returned: the
    handler's bug, which the model must not read as its tool's answer."""
    if isinstance(results, str | bytes) or not isinstance(results, Sequence):
        raise ToolResultTypeError(
            f"external_tool_handler {_name(handler)} returned {describe_value(results)}, not a list of "
            f"ToolResult: {_SHAPE}"
        )
    for i, r in enumerate(results):
        if not isinstance(r, ToolResult):
            raise ToolResultTypeError(
                f"external_tool_handler {_name(handler)} returned a {type(results).__name__} "
                f"whose item {i} is {describe_value(r)}, not a ToolResult: {_SHAPE}"
            )
    for r in results:
        if not isinstance(r.content, str):
            raise ToolResultTypeError(
                f"external_tool_handler {_name(handler)} returned a ToolResult for tool "
                f"{r.name!r} whose content is {describe_value(r.content)}; content is the text the model "
                "reads: a str (ludic.agents.tool_results_from_json writes other JSON values as "
                "JSON text)"
            )
    by_id = {r.tool_call_id: r for r in results}
    return [
        by_id.get(c.id) or _error_results([c], "the tool handler returned no result")[0]
        for c in calls
    ]
