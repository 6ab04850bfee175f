"""Choosing where training runs: FSDP2 under torchrun, else one process.

Kept apart from `runtime` (the seam) and `fsdp` (the FSDP2 runtime, which builds on `runtime`)
so neither of those imports the other in a circle.
"""

from __future__ import annotations

import os

import torch

from ludic.training.parallel.runtime import LocalRuntime, TrainingRuntime


def launched_world_size() -> int:
    """WORLD_SIZE set by torchrun (1 outside it)."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, got {value!r}") from None


def auto_runtime(device: str | torch.device = "cpu") -> TrainingRuntime:
    """FSDP2 when launched by torchrun with WORLD_SIZE > 1 (or when a process group with more
    than one rank is already initialised), else `LocalRuntime(device)`."""
    import torch.distributed as dist

    grouped = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if grouped or launched_world_size() > 1:
        from ludic.training.parallel.fsdp import FSDPRuntime

        return FSDPRuntime.from_env(device)
    return LocalRuntime(device)
