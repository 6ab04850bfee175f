"""GiGPO's credit on evaluated episodes: would its step-level signal find anchor states here?

`ludic eval --credit gigpo` runs the GiGPO credit assigner (with the `--gigpo.*` knobs `ludic
train` takes) over the evaluation's episode groups (the `samples_per_problem` episodes of each
problem) and reports how many turns share an anchor state with another turn and how large the
episode- and step-level advantages are; `credit.jsonl` holds the per-turn breakdown. A fraction
of anchored turns near 0 means GiGPO reduces to GRPO on this env (check its `state_key`). It
trains nothing. `ludic.training` (and torch) load only when `gigpo_credit_report` runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ludic.recipes.algorithms import GiGPOOptions
from ludic.types import Rollout

CREDIT_FILE = "credit.jsonl"


def gigpo_credit_report(
    rollouts: Sequence[Rollout], options: GiGPOOptions
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics (`gigpo/...`) and one row per turn (rollout id, turn id, A_E, A_S, return-to-go,
    anchor group size, advantage) of GiGPO's credit on `rollouts`."""
    details = options.credit().details(rollouts)
    rows = [
        {
            "rollout_id": rollout_id,
            "turn_id": turn_id,
            "episode_advantage": c.episode_advantage,
            "step_advantage": c.step_advantage,
            "return_to_go": c.return_to_go,
            "anchor_group_size": c.anchor_group_size,
            "advantage": c.advantage,
        }
        for (rollout_id, turn_id), c in details.items()
    ]
    return _metrics(rows), rows


def _metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    n = len(rows)
    anchored = [r["anchor_group_size"] for r in rows if r["anchor_group_size"] >= 2]

    def mean_abs(key: str) -> float:
        return math.fsum(abs(r[key]) for r in rows) / n if n else 0.0

    return {
        "gigpo/turns": float(n),
        "gigpo/anchored_turn_fraction": len(anchored) / n if n else 0.0,
        "gigpo/mean_anchor_group_size": math.fsum(anchored) / len(anchored) if anchored else 0.0,
        "gigpo/mean_abs_episode_advantage": mean_abs("episode_advantage"),
        "gigpo/mean_abs_step_advantage": mean_abs("step_advantage"),
    }


def write_credit_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    """One JSON object per turn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


__all__ = ["CREDIT_FILE", "gigpo_credit_report", "write_credit_rows"]
