"""The README's "Metrics on every step" paragraph names every mismatch metric the Trainer logs."""

from __future__ import annotations

from pathlib import Path

import torch

from ludic.training.mismatch import mismatch_metrics

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_mismatch_metric_is_named_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("**Metrics on every step**")
    paragraph = text[start : text.index("\n\n", start)]
    logprobs_BT = torch.tensor([[-1.0, -2.0]])
    metrics = mismatch_metrics(
        logprobs_BT, logprobs_BT - 0.1, torch.ones(1, 2), total_action_tokens=2
    )
    assert metrics, "two action tokens with behaviour logprobs give mismatch metrics"
    missing = [key for key in metrics if f"`{key}`" not in paragraph]
    assert not missing, f"README's metrics paragraph does not name {missing}"
    assert "`loss/mismatch/k3`" in paragraph  # the logged name, prefix included
