"""Interaction protocols (the objects that own the agent <-> env loop) and the termination
rules every protocol takes (`termination=[...]`)."""

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
from ludic.interaction.single_agent import SingleAgentProtocol, ValueEstimator
from ludic.interaction.termination import (
    ContextBudget,
    CriticalError,
    MaxSteps,
    OutputRegex,
    TerminateAction,
    Termination,
    TerminationRule,
    TerminationRules,
    TurnView,
)

__all__ = [
    "DELEGATE_TOOL",
    "RESERVED_INFO_KEYS",
    "ContextBudget",
    "CriticalError",
    "DelegatingProtocol",
    "ExternalToolHandler",
    "InteractionProtocol",
    "MaxSteps",
    "MultiAgentProtocol",
    "OutputRegex",
    "SingleAgentProtocol",
    "SubAgentSpec",
    "TaskEnv",
    "TerminateAction",
    "Termination",
    "TerminationRule",
    "TerminationRules",
    "ToolCallContext",
    "TraceCollector",
    "TurnView",
    "ValueEstimator",
    "act_with_tools",
    "delegate",
    "final_answer",
    "merge_step_info",
]
