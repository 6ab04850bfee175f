"""Interaction protocols: the objects that own the agent <-> env loop."""

from ludic.interaction.acting import ExternalToolHandler, ToolCallContext, act_with_tools
from ludic.interaction.base import InteractionProtocol
from ludic.interaction.collector import TraceCollector
from ludic.interaction.delegation import (
    DELEGATE_TOOL,
    DelegatingProtocol,
    SubAgentSpec,
    TaskEnv,
    delegate,
    final_answer,
)
from ludic.interaction.info import RESERVED_INFO_KEYS, merge_step_info
from ludic.interaction.multi_agent import MultiAgentProtocol
from ludic.interaction.single_agent import SingleAgentProtocol

__all__ = [
    "DELEGATE_TOOL",
    "RESERVED_INFO_KEYS",
    "DelegatingProtocol",
    "ExternalToolHandler",
    "InteractionProtocol",
    "MultiAgentProtocol",
    "SingleAgentProtocol",
    "SubAgentSpec",
    "TaskEnv",
    "ToolCallContext",
    "TraceCollector",
    "act_with_tools",
    "delegate",
    "final_answer",
    "merge_step_info",
]
