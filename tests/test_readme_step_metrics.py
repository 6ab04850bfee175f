"""The README's "Metrics on every step" names each metric where a Trainer step logs it: the
mismatch metrics under `loss/`, the policy-lag counts at the top level (a user greps
metrics.jsonl for these exact keys)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from tests.training.test_on_policy_ratio import first_step

from ludic.training import make_grpo

README = Path(os.environ.get("LUDIC_README", Path(__file__).resolve().parents[1] / "README.md"))
HEADING = "**Metrics on every step**"
TOP_LEVEL = "at the top level"


def _paragraph() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(HEADING)
    return text[start : text.index("\n\n", start)]


def _named(metric_text: str, family: str) -> set[str]:
    """`family/x` names and the `/y` shorthands that follow them, as full keys."""
    return {f"{family}/{m}" for m in re.findall(rf"`(?:{family})?/([\w+]+)`", metric_text)}


@pytest.mark.slow
def test_each_named_metric_is_logged_where_the_readme_says() -> None:
    under_loss, top_level = _paragraph().split(TOP_LEVEL)
    mismatch, lag = _named(under_loss, "mismatch"), _named(top_level, "policy_lag")
    assert len(mismatch) == 5 and len(lag) == 8, (mismatch, lag)
    metrics = first_step(make_grpo())
    assert sorted(f"loss/{k}" for k in mismatch if f"loss/{k}" not in metrics) == []
    assert sorted(k for k in lag if k not in metrics) == []
