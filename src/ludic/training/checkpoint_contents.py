"""What a checkpoint holds, in memory (`LoadedCheckpoint`, each rank's `RankState`), and how it
goes back into live objects: reading a checkpoint directory, capturing and restoring the RNG
states, restoring weights, optimizer and scheduler. Writing, listing, retention and verifying
against the manifest are `checkpoint`'s; this module does not verify (`read_checkpoint` trusts
a directory `CheckpointManager.resolve` has checked).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ludic.training.checkpoint_faults import check_optimizer_state_fits, check_saved_state
from ludic.training.parallel.state import fit_state_to_model
from ludic.training.weights_io import CorruptCheckpointError, read_state_dict
from ludic.types import JSON

logger = logging.getLogger(__name__)

STATE = "state.json"
RANK_STATES = "rank_states.pt"


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedCheckpoint:
    """Everything a checkpoint stores, read into memory (model weights as a CPU state dict)."""

    path: Path
    step: int
    policy_version: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None
    scheduler_state: dict[str, Any] | None
    rng_state: dict[str, Any]
    data_state: JSON = field(default_factory=dict)
    extra: JSON = field(default_factory=dict)
    rank_states: list[RankState] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RankState:
    """One rank's RNG and data position (its batch source's `state_dict()`)."""

    data_state: JSON
    rng_json: JSON | None
    rng_tensors: dict[str, Any]


def capture_rank_state(data_state: JSON) -> RankState:
    rng_json, rng_tensors = capture_rng_state()
    return RankState(data_state=data_state, rng_json=rng_json, rng_tensors=rng_tensors)


def rank_state_for(checkpoint: LoadedCheckpoint, rank: int, world_size: int) -> RankState:
    """Rank `rank`'s own saved state when the checkpoint was written by `world_size` ranks;
    otherwise (another world size, or a single-process checkpoint) rank 0's, for every rank."""
    saved = checkpoint.rank_states
    written_by = 1 if saved is None else len(saved)  # a one-process run saves no rank states
    if written_by == world_size:
        return _rank_0_state(checkpoint) if saved is None else saved[rank]
    if rank == 0:
        logger.warning(
            "%s was written by %d rank%s, resuming on %d: every rank takes rank 0's RNG and "
            "data position",
            checkpoint.path.name,
            written_by,
            "" if written_by == 1 else "s",
            world_size,
        )
    return _rank_0_state(checkpoint)


def _rank_0_state(checkpoint: LoadedCheckpoint) -> RankState:
    """Rank 0's RNG and data position, as every checkpoint holds them."""
    rng = checkpoint.rng_state
    return RankState(
        data_state=checkpoint.data_state, rng_json=rng.get("json"), rng_tensors=rng["tensors"]
    )


def capture_rng_state() -> tuple[JSON, dict[str, Any]]:
    """(python + numpy state as JSON, torch CPU/CUDA states as tensors)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    json_state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, np.asarray(keys).tolist(), pos, has_gauss, cached],
    }
    tensors: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    return json_state, tensors


def restore_rng_state(json_state: JSON, tensors: dict[str, Any]) -> None:
    version, internal, gauss = json_state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = json_state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        # One state per GPU the saving process saw: a run saved where 8 were visible resumes
        # where 1 is (`set_rng_state_all` raised "invalid device ordinal" for the 2nd to 8th).
        saved, visible = tensors["cuda"], torch.cuda.device_count()
        for index, state in enumerate(saved[:visible]):
            torch.cuda.set_rng_state(state, index)


def _torch_file(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CorruptCheckpointError(f"{path}: cannot be read ({e})") from e


def read_checkpoint(path: str | Path, *, with_weights: bool = True) -> LoadedCheckpoint:
    """Read a checkpoint directory without verifying its manifest (see `CheckpointManager`).
    `with_weights=False` skips the model and optimizer states (ranks that receive them by
    broadcast from rank 0)."""
    path = Path(path)
    try:
        state = json.loads((path / STATE).read_text())
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: {STATE} is missing or unreadable ({e})") from e
    rng_tensors = _torch_file(path / "rng.pt") or {}
    check_saved_state(path, state, rng_tensors if (path / "rng.pt").is_file() else None)
    ranks = _torch_file(path / RANK_STATES)
    return LoadedCheckpoint(
        path=path,
        step=int(state["step"]),
        policy_version=int(state["policy_version"]),
        model_state=read_state_dict(path / "model") if with_weights else {},
        optimizer_state=_torch_file(path / "optimizer.pt") if with_weights else None,
        scheduler_state=_torch_file(path / "scheduler.pt"),
        rng_state={"json": state.get("rng"), "tensors": rng_tensors},
        data_state=dict(state.get("data_state", {})),
        extra=dict(state.get("extra", {})),
        rank_states=None if ranks is None else [RankState(**r) for r in ranks],
    )


def restore_into(
    checkpoint: LoadedCheckpoint,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    restore_rng: bool = True,
) -> None:
    """Load a checkpoint's weights, optimizer, scheduler and RNG states into live objects
    (single process; the Trainer goes through its runtime instead)."""
    fitted, partial = fit_state_to_model(model, checkpoint.model_state)
    model.load_state_dict(fitted, strict=not partial)
    if optimizer is not None and checkpoint.optimizer_state is not None:
        check_optimizer_state_fits(optimizer, checkpoint.optimizer_state, checkpoint.path)
        optimizer.load_state_dict(checkpoint.optimizer_state)
    if scheduler is not None and checkpoint.scheduler_state is not None:
        scheduler.load_state_dict(checkpoint.scheduler_state)
    rng = checkpoint.rng_state
    if restore_rng and rng.get("json") is not None:
        restore_rng_state(rng["json"], rng["tensors"])
