"""A rich progress bar over evaluation episodes, showing the running mean reward and success.

Display only: it never changes what runs or in which order. Disabled, it draws nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ludic.eval.records import EpisodeRecord


class EvalProgress:
    """Context manager: `with EvalProgress(total=n) as bar: ... bar.advance(records)`.

    `total` counts requests (episodes); `advance` takes the records of one finished request
    (several for multi-agent protocols) and updates reward / success / failure counts.
    """

    def __init__(
        self,
        total: int,
        *,
        description: str = "eval",
        enabled: bool = True,
        console: Console | None = None,
    ) -> None:
        self.total = total
        self.enabled = enabled
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
        )
        self._task: TaskID | None = None
        self._description = description
        self._reward_sum = 0.0
        self._episodes = 0
        self._successes = 0
        self._failures = 0

    def __enter__(self) -> EvalProgress:
        self._progress.start()
        self._task = self._progress.add_task(self._description, total=self.total, stats="")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    @property
    def stats_text(self) -> str:
        if not self._episodes:
            return ""
        text = (
            f"reward [cyan]{self._reward_sum / self._episodes:.3f}[/cyan]  "
            f"success [green]{self._successes / self._episodes:.0%}[/green]"
        )
        if self._failures:
            text += f"  failed [red]{self._failures}[/red]"
        return text

    def advance(self, records: Sequence[EpisodeRecord]) -> None:
        """Count one finished request and its episode records."""
        for record in records:
            self._episodes += 1
            self._reward_sum += record.total_reward
            self._successes += int(record.success)
            self._failures += int(record.failed)
        if self._task is not None:
            self._progress.update(self._task, advance=1, stats=self.stats_text)
