"""A rich table of evaluation metrics for the terminal. Formatting only; no metric is computed
here."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

_COUNT_KEYS = ("episodes",)
_RATE_HINTS = ("rate", "pass@", "outcome/")


def summary_table(metrics: Mapping[str, float], *, title: str = "Evaluation") -> Table:
    """Metrics in reading order: headline numbers, pass@k / mean@k, outcomes, the rest."""
    table = Table(title=title, title_style="bold", show_lines=False, header_style="bold cyan")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for section in _sections(metrics):
        for key in section:
            table.add_row(key, _format(key, metrics[key]))
        table.add_section()
    return table


def print_summary(
    metrics: Mapping[str, float], *, title: str = "Evaluation", console: Console | None = None
) -> None:
    (console or Console()).print(summary_table(metrics, title=title))


def _sections(metrics: Mapping[str, float]) -> list[list[str]]:
    head = [k for k in ("episodes", "reward/mean", "success_rate") if k in metrics]
    at_k = sorted(
        (k for k in metrics if k.startswith(("pass@", "mean@"))),
        key=lambda k: (k.split("@")[0], int(k.split("@")[1]) if k.split("@")[1].isdigit() else 0),
    )
    outcomes = sorted(k for k in metrics if k.startswith("outcome/"))
    used = set(head) | set(at_k) | set(outcomes)
    rest = sorted(k for k in metrics if k not in used)
    return [s for s in (head, at_k, outcomes, rest) if s]


def _format(key: str, value: float) -> str:
    if key in _COUNT_KEYS:
        return f"{int(value)}"
    if any(hint in key for hint in _RATE_HINTS) and 0.0 <= value <= 1.0:
        return f"{value:.3f}  ({value:.0%})"
    return f"{value:.4g}"
