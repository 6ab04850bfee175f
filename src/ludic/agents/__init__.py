"""Agents: an LLM with state (client + context + parser), optionally with tools."""

from ludic.agents.base import Agent, AgentAct, derive_call_seed, resolve_sampling
from ludic.agents.code_tool import format_sandbox_result, make_python_tool
from ludic.agents.context_editing import ContextEditingAgent
from ludic.agents.react import ReActAgent
from ludic.agents.tool_agent import ToolAgent, tool_results_from_json
from ludic.agents.tools import (
    Tool,
    ToolResultTypeError,
    execute_tool,
    parse_tool_calls,
    tool_from_callable,
)

__all__ = [
    "Agent",
    "AgentAct",
    "ContextEditingAgent",
    "ReActAgent",
    "Tool",
    "ToolAgent",
    "ToolResultTypeError",
    "derive_call_seed",
    "execute_tool",
    "format_sandbox_result",
    "make_python_tool",
    "parse_tool_calls",
    "resolve_sampling",
    "tool_from_callable",
    "tool_results_from_json",
]
