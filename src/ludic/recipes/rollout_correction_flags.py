"""`ludic train --rollout-correction.*`: the rollout importance-sampling correction of the
preset's loss (`ludic.training.with_rollout_correction`) as CLI flags.

rho = pi_old / mu compares the trainer's policy with the behaviour policy the inference engine
sampled from (policy lag, bf16 kernels); `TruncatedIS` weights each token's term by
min(rho, cap) and `RejectOutside` drops tokens whose rho leaves [low, high], each at the token,
sequence or geometric level (`ludic.training.losses.rollout_correction`). Both are off unless
their bound is given, and a level given without its correction is refused (it would be
ignored). Values are checked here, naming the flag, before any model loads; importing this
module is light (no torch).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ludic.training.algorithm_types import RLAlgorithm

CorrectionLevel = Literal["token", "sequence", "geometric"]
"""Where rho is taken: per token, per sequence (the product over its tokens) or geometric (the
per-token geometric mean over the sequence, GSPO-style)."""

FLAG_PREFIX = "--rollout-correction."


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutCorrectionOptions:
    """Rollout IS correction of the loss; off unless --rollout-correction.tis-cap or a
    --rollout-correction.reject-* bound is given. Turn it on when the logged mismatch/* metrics
    or the policy lag are not near zero."""

    tis_cap: float | None = None
    """Truncated IS: weight each token's term by min(rho, cap); cap >= 1 (e.g. 2.0)."""
    tis_level: CorrectionLevel = "token"
    """Where truncated IS takes rho (token, sequence or geometric); needs
    --rollout-correction.tis-cap."""
    reject_low: float | None = None
    """Reject (weight 0) tokens whose rho is below this, in [0, 1] (e.g. 0.5)."""
    reject_high: float | None = None
    """Reject tokens whose rho is above this, >= 1 (e.g. 2.0); one bound alone leaves the
    other side open."""
    reject_level: CorrectionLevel = "token"
    """Where rejection takes rho (e.g. sequence: a whole sequence kept or rejected); needs a
    --rollout-correction.reject-* bound."""

    @property
    def truncates(self) -> bool:
        return self.tis_cap is not None

    @property
    def rejects(self) -> bool:
        return self.reject_low is not None or self.reject_high is not None

    @property
    def on(self) -> bool:
        return self.truncates or self.rejects

    def check(self) -> None:
        """Refuse a value the correction cannot use, or a level whose correction is off,
        naming the flag and the fix."""
        cap, low, high = self.tis_cap, self.reject_low, self.reject_high
        if cap is not None and not (math.isfinite(cap) and cap >= 1.0):
            raise ValueError(
                f"{FLAG_PREFIX}tis-cap must be a finite number >= 1 (weights are min(rho, cap); "
                f"a cap below 1 would down-weight on-policy tokens), got {cap}: e.g. 2.0"
            )
        if low is not None and not 0.0 <= low <= 1.0:
            raise ValueError(
                f"{FLAG_PREFIX}reject-low must be in [0, 1] (an on-policy token, rho 1, is "
                f"always kept), got {low}: e.g. 0.5"
            )
        if high is not None and not high >= 1.0:  # nan too; inf is an open side
            raise ValueError(
                f"{FLAG_PREFIX}reject-high must be >= 1 (an on-policy token, rho 1, is always "
                f"kept), got {high}: e.g. 2.0"
            )
        if self.tis_level != "token" and not self.truncates:
            raise _unread("tis-level", self.tis_level, "tis-cap")
        if self.reject_level != "token" and not self.rejects:
            raise _unread(
                "reject-level", self.reject_level, f"reject-low or {FLAG_PREFIX}reject-high"
            )

    def apply(self, algorithm: RLAlgorithm) -> RLAlgorithm:
        """`algorithm` with these corrections of its loss (unchanged when off)."""
        self.check()
        if not self.on:
            return algorithm
        from ludic.training.algorithm import with_rollout_correction
        from ludic.training.losses import RejectOutside, TruncatedIS

        corrections: list[Any] = []
        if self.tis_cap is not None:
            corrections.append(TruncatedIS(level=self.tis_level, cap=self.tis_cap))
        if self.rejects:
            low = 0.0 if self.reject_low is None else self.reject_low
            high = math.inf if self.reject_high is None else self.reject_high
            corrections.append(RejectOutside(level=self.reject_level, low=low, high=high))
        return with_rollout_correction(algorithm, *corrections)

    def settings(self) -> dict[str, Any]:
        """Every knob by flag name when a correction is on (what a checkpoint records), else
        nothing: a run without it records what runs saved before the flags existed."""
        if not self.on:
            return {}
        return {FLAG_PREFIX + k.replace("_", "-"): v for k, v in asdict(self).items()}


def _unread(flag: str, level: str, needs: str) -> ValueError:
    return ValueError(
        f"{FLAG_PREFIX}{flag} {level} applies only with {FLAG_PREFIX}{needs} (that correction "
        "is off, so it would be ignored): drop it or turn the correction on"
    )


OFF_SETTINGS: dict[str, Any] = {
    FLAG_PREFIX + k.replace("_", "-"): v for k, v in asdict(RolloutCorrectionOptions()).items()
}
"""What an absent record means: every correction off."""


__all__ = ["OFF_SETTINGS", "CorrectionLevel", "RolloutCorrectionOptions"]
