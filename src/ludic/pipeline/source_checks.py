"""What `PipelineBatchSource` checks and says outside its read loop: its settings, refused at
construction (`check_source_settings`), and the warning for a sample newer than the learner
(`ahead_warning`)."""

from __future__ import annotations

from collections.abc import Callable


def check_source_settings(
    batch_size: int,
    stale: str,
    stale_decay: float,
    max_lag: int | None,
    current_version: Callable[[], int] | None,
    ack: str,
) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if stale not in ("drop", "downweight"):
        raise ValueError(f"stale must be 'drop' or 'downweight', got {stale!r}")
    if max_lag is not None and (max_lag < 0 or current_version is None):
        raise ValueError("max_lag needs to be >= 0 and a current_version callable")
    if not 0.0 <= stale_decay <= 1.0:
        raise ValueError(f"stale_decay must be in [0, 1], got {stale_decay}")
    if ack not in ("checkpoint", "step"):
        raise ValueError(f"ack must be 'checkpoint' or 'step', got {ack!r}")


def ahead_warning(sample_version: int, learner_version: int) -> str:
    """A sample newer than the learner: weights this learner does not hold sampled it (it
    publishes a version only once it has it)."""
    return (
        f"a sample carries policy version {sample_version}, newer than this learner's "
        f"{learner_version}: weights this learner does not hold sampled it (it resumed from a "
        "checkpoint older than the last weights it published, or started afresh against a "
        "server an earlier run published to, or a server or embedded actor started on a "
        "training checkpoint carries that checkpoint's version while this learner starts a new "
        "run from its weights: pass --policy-version 0 to `ludic serve` / `ludic actor`, or two "
        "runs share the stream). Such samples are never counted stale; if they come from "
        "another run, start with a new --stream and restart the server"
    )
