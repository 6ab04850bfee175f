"""Core records shared by every layer: messages, token traces, steps and rollouts.

This package only re-exports: `messages` (Message, tool calls, parse results), `tokens`
(BehaviorSampling, TokenTrace), `steps` (AgentStep, EnvironmentStep, StepOutcome) and
`rollout` (Rollout, Turn).

Every record round-trips exactly through JSON (`to_dict` / `from_dict`), because offline data
files and the Redis pipeline carry them. Records are plain data: no behaviour beyond validation
and small derived views (`Rollout.turns()`). Nothing here imports torch.
"""

from ludic.types.messages import (
    JSON,
    Info,
    Message,
    ParseResult,
    ToolCall,
    ToolResult,
    new_id,
)
from ludic.types.rollout import Rollout, Turn
from ludic.types.steps import (
    ACTION_TARGETS,
    TRUNCATION_REASONS,
    ActionTarget,
    AgentStep,
    EnvironmentStep,
    Step,
    StepOutcome,
    TruncationReason,
    step_from_dict,
)
from ludic.types.tokens import BehaviorSampling, TokenTrace

__all__ = [
    "ACTION_TARGETS",
    "JSON",
    "TRUNCATION_REASONS",
    "ActionTarget",
    "AgentStep",
    "BehaviorSampling",
    "EnvironmentStep",
    "Info",
    "Message",
    "ParseResult",
    "Rollout",
    "Step",
    "StepOutcome",
    "TokenTrace",
    "ToolCall",
    "ToolResult",
    "TruncationReason",
    "Turn",
    "new_id",
    "step_from_dict",
]
