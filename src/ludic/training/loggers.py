"""Training loggers behind one small protocol: a rich console line, a JSONL metrics file, and
optional Weights & Biases / TensorBoard (imported only when constructed).

Loggers only record `{name: float}` per step; they never decide what to measure.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rich.console import Console

from ludic._resumed_log import ResumedLog, step_of

Metrics = Mapping[str, float]


@runtime_checkable
class TrainingLogger(Protocol):
    """Receives the metrics of one step; `close` flushes and releases resources."""

    def log(self, metrics: Metrics, step: int) -> None: ...

    def close(self) -> None: ...


def _json_value(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # nan/inf are not valid JSON


class JsonlLogger:
    """Appends one JSON object per step: `{"step", "time", **metrics}` (nan/inf as strings).

    The first step it logs drops the file's records of that step and later ones: a run resumed
    from a checkpoint logs again the steps an interrupted run logged after that checkpoint, and
    those belong to the stretch the resume discarded (as TensorBoard's `purge_step`). A line
    cut off by a killed run goes with them, so the next record does not continue it
    (`ludic._resumed_log`, which the rollout and sample logs share).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._resumed = ResumedLog(self.path, step_of)

    def log(self, metrics: Metrics, step: int) -> None:
        if self._resumed.before_write(step):  # rewritten: append to the new file
            self._file.close()
            self._file = self.path.open("a", encoding="utf-8")
        record: dict[str, Any] = {"step": step, "time": time.time()}
        record.update({k: _json_value(float(v)) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records a `JsonlLogger` wrote, in order."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class RichConsoleLogger:
    """Prints one compact line per `every` steps with the chosen `keys` (all when None)."""

    def __init__(
        self,
        *,
        keys: Sequence[str] | None = ("loss", "grad_norm", "lr", "reward_mean", "step_seconds"),
        every: int = 1,
        console: Console | None = None,
    ) -> None:
        self.keys = None if keys is None else tuple(keys)
        self.every = max(1, every)
        self.console = console or Console()

    def log(self, metrics: Metrics, step: int) -> None:
        if step % self.every:
            return
        names = self.keys if self.keys is not None else tuple(sorted(metrics))
        parts = [f"[bold]step {step}[/bold]"]
        parts += [f"{k}=[cyan]{metrics[k]:.4g}[/cyan]" for k in names if k in metrics]
        if metrics.get("skipped_nonfinite"):
            parts.append("[red]skipped: non-finite loss/grad[/red]")
        self.console.print("  ".join(parts))

    def close(self) -> None:
        pass


class WandbLogger:
    """Logs to Weights & Biases (`pip install wandb`); kwargs go to `wandb.init`."""

    def __init__(self, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError("WandbLogger needs wandb: pip install 'ludic[wandb]'") from e
        self._run = wandb.init(**init_kwargs)

    def log(self, metrics: Metrics, step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class TensorBoardLogger:
    """Writes TensorBoard scalars to `log_dir` (`pip install tensorboard`)."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                "TensorBoardLogger needs tensorboard: pip install 'ludic[tensorboard]'"
            ) from e
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Metrics, step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self._writer.close()


class MultiLogger:
    """Fans each call out to several loggers, in order."""

    def __init__(self, loggers: Sequence[TrainingLogger]) -> None:
        self.loggers = list(loggers)

    def log(self, metrics: Metrics, step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
