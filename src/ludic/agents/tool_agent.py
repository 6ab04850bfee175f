"""ToolAgent: an agent that may call tools before giving its final action.

Internal tools run inside the agent (results go to its context and it calls the model again);
external tools are handed to the protocol, which feeds results back. Every model call is an
AgentStep. Tool problems the model caused (unknown tool, bad JSON, bad arguments, a tool that
raises) become error results the model sees, never exceptions; a tool's result JSON cannot hold
(`ToolResultTypeError`) and a sandbox that never started (`SandboxStartError`) fail the episode
instead (`execute_tool`). It does not sandbox tools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ludic.agents.base import Agent, AgentAct
from ludic.agents.tools import (
    INVALID_TOOL,
    Tool,
    as_tool,
    execute_tool,
    parse_tool_calls,
    strip_tool_calls,
    tool_result_text,
)
from ludic.inference.client import ChatClient, ChatResponse
from ludic.inference.sampling import SamplingConfig
from ludic.types import AgentStep, Info, Message, ToolCall, ToolResult

ToolLike = Tool | Callable[..., Any]


class ToolAgent(Agent):
    """An agent with internal `tools` and `external_tools`.

    Each `act()` runs up to `max_inner_steps` model calls: calls with only internal tool calls
    are recorded with `action_target="internal"`; a call with any external tool call ends the
    act with `action_target="external"` (internal calls in it run first); a call without tool
    calls is parsed as the final action (`"env"`). Hitting the cap is a parse failure with
    `info["tool_loop_exhausted"]`. With `reject_incomplete_completions`, a cut-off completion is
    a parse failure even if it holds a tool call (its tools do not run).
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        tools: Sequence[ToolLike] = (),
        external_tools: Sequence[ToolLike] = (),
        max_inner_steps: int = 8,
        max_tool_result_chars: int = 4000,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, **kwargs)
        if max_inner_steps < 1:
            raise ValueError(f"max_inner_steps must be >= 1, got {max_inner_steps}")
        self.tools = {t.name: t for t in map(as_tool, tools)}
        self.external_tools = {t.name: t for t in map(as_tool, external_tools)}
        clash = set(self.tools) & set(self.external_tools)
        if clash:
            raise ValueError(f"tool names used as both internal and external: {sorted(clash)}")
        self.max_inner_steps = max_inner_steps
        self.max_tool_result_chars = max_tool_result_chars

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in (*self.tools.values(), *self.external_tools.values())]

    async def act(
        self,
        *,
        turn_id: str,
        sampling: SamplingConfig | None = None,
        step_info: Info | None = None,
    ) -> AgentAct:
        steps: list[AgentStep] = []
        for loop_index in range(self.max_inner_steps):
            response, prompt = await self._call_model(sampling, self.tool_schemas())
            # A cut-off completion is rejected whole (a parse failure), tool calls included.
            incomplete = self.reject_incomplete_completions and response.finish_reason == "length"
            calls, problems = ([], {}) if incomplete else self._tool_calls(response)
            self.context.on_after_act(_assistant_message(response, calls))
            if not calls:
                parse_result, info = await self.parse_completion(response)
                steps.append(
                    self._make_step(
                        turn_id=turn_id,
                        loop_index=loop_index,
                        prompt=prompt,
                        response=response,
                        action_target="env",
                        parse_result=parse_result,
                        step_info=step_info,
                        info=info,
                    )
                )
                return AgentAct(steps=tuple(steps), parse_result=parse_result)
            external = [c for c in calls if c.name in self.external_tools]
            results = await self._run_internal(
                [c for c in calls if c.name not in self.external_tools], problems
            )
            if results:
                self.context.on_tool_results(results)
            target = "external" if external else "internal"
            errors = sum(r.is_error for r in results)
            steps.append(
                self._make_step(
                    turn_id=turn_id,
                    loop_index=loop_index,
                    prompt=prompt,
                    response=response,
                    action_target=target,
                    parse_result=None,
                    step_info=step_info,
                    info={"tool_errors": errors} if results else {},
                    tool_calls=calls,
                    tool_results=results,
                )
            )
            if external:
                return AgentAct(steps=tuple(steps), external_calls=tuple(external))
        return self.give_up(
            steps,
            f"You used {self.max_inner_steps} model calls without giving a final answer. "
            "Give your final answer now.",
        )

    def _tool_calls(self, response: ChatResponse) -> tuple[list[ToolCall], dict[str, str]]:
        if response.tool_calls:
            return list(response.tool_calls), {}
        parsed = parse_tool_calls(response.text)
        return [c for c, _ in parsed], {c.id: p for c, p in parsed if p is not None}

    async def _run_internal(
        self, calls: Sequence[ToolCall], problems: dict[str, str]
    ) -> list[ToolResult]:
        results = []
        for call in calls:
            if call.name == INVALID_TOOL or call.id in problems:
                msg = problems.get(call.id, "invalid tool call")
                results.append(
                    ToolResult(
                        tool_call_id=call.id, name=call.name, content=f"Error: {msg}", is_error=True
                    )
                )
                continue
            results.append(
                await execute_tool(
                    self.tools.get(call.name), call, max_chars=self.max_tool_result_chars
                )
            )
        return results


def _assistant_message(response: ChatResponse, calls: Sequence[ToolCall]) -> Message:
    """The reply as the context stores it. Calls parsed from the text move out of the content
    into `tool_calls` (what a server's tool parser returns too), so the chat template renders
    each call once."""
    parsed_from_text = bool(calls) and not response.tool_calls
    content = strip_tool_calls(response.text) if parsed_from_text else response.text
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [c.to_message_part() for c in calls]
    return message


def tool_results_from_json(calls: Sequence[ToolCall], outputs: Sequence[Any]) -> list[ToolResult]:
    """Pair external tool outputs (str, or JSON values: numpy / torch ones are converted) with
    their calls. An output JSON cannot hold raises `ToolResultTypeError` naming the tool,
    which fails the episode rather than becoming an error result (see `act_with_tools`)."""
    return [
        ToolResult(tool_call_id=c.id, name=c.name, content=tool_result_text(o, tool_name=c.name))
        for c, o in zip(calls, outputs, strict=True)
    ]


__all__ = ["ToolAgent", "ToolLike", "tool_results_from_json"]
