"""Training samples as plain data: SAWItem (State/Action tokens + Weight) and the seams that
produce their weights. No torch here: tensors are made by `ludic.training.collate`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ludic.types import JSON, Rollout

TurnKey = tuple[str, str]  # (rollout id, turn id)


@dataclass(frozen=True, kw_only=True, slots=True)
class SAWItem:
    """One training sample: a token sequence, which tokens are actions, and a weight.

    - `input_ids`: the full sequence (prompt and completions) as the model saw it.
    - `action_mask`: 1 for tokens the policy sampled (trained on), 0 for prompt/tool tokens.
    - `behavior_logprobs`: per-token logprobs of the sampling policy, aligned with
      `input_ids` (0.0 where `action_mask` is 0), or None when the backend gave none.
    - `weight`: the scalar credit (advantage) for every action token of this sample.
    - `meta`: rollout_id, turn_id, agent_id, group_id, segment_index, is_snapshot, reward,
      weight_source, policy_versions, terminated, truncated, episode_truncated,
      truncation_reason, finish_reason, parse_error, incomplete_completion, ...
    """

    input_ids: tuple[int, ...]
    action_mask: tuple[int, ...]
    weight: float
    behavior_logprobs: tuple[float, ...] | None = None
    meta: JSON = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.action_mask) != n:
            raise ValueError(
                f"SAWItem: action_mask has {len(self.action_mask)} entries for {n} tokens"
            )
        if self.behavior_logprobs is not None and len(self.behavior_logprobs) != n:
            raise ValueError(
                f"SAWItem: behavior_logprobs has {len(self.behavior_logprobs)} entries for {n} tokens"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def policy_versions(self) -> tuple[int, ...]:
        return tuple(self.meta.get("policy_versions", ()))

    def to_dict(self) -> JSON:
        return {
            "input_ids": list(self.input_ids),
            "action_mask": list(self.action_mask),
            "weight": self.weight,
            "behavior_logprobs": (
                None if self.behavior_logprobs is None else list(self.behavior_logprobs)
            ),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SAWItem:
        lp = d.get("behavior_logprobs")
        return cls(
            input_ids=tuple(int(t) for t in d["input_ids"]),
            action_mask=tuple(int(m) for m in d["action_mask"]),
            weight=float(d["weight"]),
            behavior_logprobs=None if lp is None else tuple(float(x) for x in lp),
            meta=dict(d.get("meta", {})),
        )


@runtime_checkable
class CreditAssigner(Protocol):
    """Turns a batch of rollouts into one scalar weight per turn.

    Returns `{(rollout.id, turn.turn_id): weight}` for every turn (see `Rollout.turns()`) of
    every rollout that is not failed. Groups (GRPO) come from `rollout.meta["group_id"]`.
    """

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]: ...


# A filter keeps a sample when it returns True.
SampleFilter = Callable[[SAWItem], bool]
