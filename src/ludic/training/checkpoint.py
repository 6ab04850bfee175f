"""Training checkpoints: atomic periodic saves with retention, verified loads.

A checkpoint `step_00000042/` holds `model/` (Hugging Face format, loadable by `from_pretrained`;
a peft adapter directory for LoRA), `optimizer.pt` (the single-process `optimizer.state_dict()`
layout), `scheduler.pt`, `rng.pt` (torch RNG), `state.json` (step, policy version, data
position, python/numpy RNG), with several ranks `rank_states.pt` (each rank's RNG and data
position) and, written last, `MANIFEST.json` listing every file with its size and sha256
(`checkpoint_manifest`). It is written to a temporary sibling directory, fsynced and renamed, so
a crash mid-save leaves the previous checkpoint intact; re-saving a step moves the old one aside
first, and a save killed between the two renames gets the old one back at the next listing
(`checkpoint_scratch`), which also removes the temporary directories killed saves leave. A
first Ctrl-C or SIGTERM during a save (main thread) is acted on once the save completes; a second
one cuts it short, rolled back as a crash would be (`checkpoint_signals`). A checkpoint without
a manifest, or whose files do not match it, is refused with a message naming the damaged file
and an earlier step that verifies; given the checkpoint root, loading picks the
newest checkpoint that verifies; a newer one under the manager's own root that it skipped as
corrupt is renamed `step_N.corrupt`, so retention and later resumes skip it (`checkpoint_faults`).
Reading a checkpoint into memory and restoring it into live objects (weights, optimizer, RNG,
each rank's data position) is `checkpoint_contents`'s. Nothing here is sharded: distributed
training hands in full states gathered on rank 0 (see `ludic.training.parallel`), so any world
size can resume.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError

from ludic.training.checkpoint_contents import (
    RANK_STATES,
    STATE,
    LoadedCheckpoint,
    RankState,
    capture_rng_state,
    read_checkpoint,
)
from ludic.training.checkpoint_faults import (  # the first two re-exported: their old home
    CheckpointModelMismatchError,  # noqa: F401
    check_checkpoint_fits,  # noqa: F401
    quarantine_checkpoint,
)
from ludic.training.checkpoint_manifest import (
    MANIFEST,
    check_files,
    deep_verify,
    earlier_good_checkpoint,
    write_manifest,
)
from ludic.training.checkpoint_save_failure import save_failed
from ludic.training.checkpoint_scratch import (
    remove_stale_scratch,
    restore_interrupted_resaves,
    scratch_name,
    swap_in,
)
from ludic.training.checkpoint_signals import signals_deferred
from ludic.training.weights_io import CorruptCheckpointError, save_weights
from ludic.types import JSON

logger = logging.getLogger(__name__)

_FORMAT = 1
_NAME = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    """Where and how often to save. After each save the newest `keep_last` complete checkpoints
    are kept, and always the one just saved (even when `dir` holds newer steps); `None` keeps
    every checkpoint. `verify` is what loading checks against the manifest: "sha256"
    (contents) or "size" (fast)."""

    dir: str
    every_n_steps: int | None = None
    keep_last: int | None = 3
    max_shard_size: int | str = "5GB"
    verify: Literal["sha256", "size"] = "sha256"

    def __post_init__(self) -> None:
        if self.every_n_steps is not None and self.every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {self.every_n_steps}")
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {self.keep_last}")
        deep_verify(self.verify)  # a typo would otherwise mean sizes only at resume


class CheckpointManager:
    """Saves, lists, verifies and loads checkpoints under `config.dir`.

    Creating one removes the temporary directories that killed saves left under `config.dir`
    (never one a live process is writing); each save's retention does it again.
    """

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self.root = Path(config.dir)
        remove_stale_scratch(self.root, warn_foreign=True)

    def due(self, step: int) -> bool:
        every = self.config.every_n_steps
        return every is not None and step > 0 and step % every == 0

    def path_for(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def save(
        self,
        *,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        policy_version: int = 0,
        data_state: JSON | None = None,
        extra: JSON | None = None,
        tokenizer: Any | None = None,
        model_state: Mapping[str, torch.Tensor] | None = None,
        optimizer_state: Mapping[str, Any] | None = None,
        rank_states: Sequence[RankState] | None = None,
    ) -> Path:
        """Write checkpoint `step` atomically, then apply retention; returns its path.

        `model_state` / `optimizer_state` replace `model.state_dict()` / `optimizer.state_dict()`
        (a sharded model's full states gathered on rank 0); `rank_states` (one per rank) are
        written when there is more than one.
        """
        final = self.path_for(step)
        tmp = self.root / scratch_name("tmp", final.name)
        if optimizer_state is None and optimizer is not None:
            optimizer_state = optimizer.state_dict()
        with signals_deferred(f"checkpoint {final}"):  # a first Ctrl-C/SIGTERM: after the save
            try:
                tmp.mkdir(parents=True)  # and the root: a read-only one is refused as below
                save_weights(
                    model,
                    tmp / "model",
                    max_shard_size=self.config.max_shard_size,
                    state_dict=model_state,
                )
                if optimizer_state is not None:
                    torch.save(dict(optimizer_state), tmp / "optimizer.pt")
                if rank_states is not None and len(rank_states) > 1:
                    torch.save([asdict(r) for r in rank_states], tmp / RANK_STATES)
                self._write(tmp, step, scheduler, policy_version, data_state, extra)
                if tokenizer is not None:
                    tokenizer.save_pretrained(str(tmp / "model"))
                self._write_manifest(tmp, step)
                self._swap_in(tmp, final)
            except (OSError, RuntimeError, SafetensorError) as e:  # a full or read-only disk
                done = complete_checkpoints(self.root)
                last = done[-1] if done else None
                failed = save_failed(e, final=final, scratch=tmp, last_complete=last)
                if failed is None:
                    raise
                raise failed from e
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            self._apply_retention(saved=final)
        return final

    def _write(
        self,
        tmp: Path,
        step: int,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        policy_version: int,
        data_state: JSON | None,
        extra: JSON | None,
    ) -> None:
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        rng_json, rng_tensors = capture_rng_state()
        torch.save(rng_tensors, tmp / "rng.pt")
        state = {
            "format": _FORMAT,
            "step": step,
            "policy_version": policy_version,
            "data_state": data_state or {},
            "extra": extra or {},
            "rng": rng_json,
        }
        (tmp / STATE).write_text(json.dumps(state))

    def _write_manifest(self, tmp: Path, step: int) -> None:
        write_manifest(tmp, step)

    def _swap_in(self, tmp: Path, final: Path) -> None:
        swap_in(tmp, final)

    def _apply_retention(self, *, saved: Path) -> None:
        """Keep the newest `keep_last` complete checkpoints, and always `saved` (the one just
        written): newer steps left by another run must not make it delete its own."""
        remove_stale_scratch(self.root)
        keep = self.config.keep_last
        if keep is None:
            return
        complete = complete_checkpoints(self.root)
        for path in complete[:-keep]:
            if path != saved:
                shutil.rmtree(path, ignore_errors=True)

    def list(self) -> list[Path]:
        """Checkpoint directories (complete or not), oldest first by step."""
        return _step_dirs(self.root)

    def verify(self, path: str | Path, *, deep: bool | None = None) -> None:
        """Raise `CorruptCheckpointError` naming the problem unless `path` is complete and every
        file matches the manifest (sizes; and sha256 when deep, default from config; files a
        manifest lists without a sha256, as older saves did: size only)."""
        deep = self.config.verify == "sha256" if deep is None else deep
        check_files(Path(path), deep=deep)

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies; broken ones are skipped with a warning."""
        return self._newest_good(self.root)[0]

    def _newest_good(
        self, root: Path, *, quarantine: bool = False
    ) -> tuple[Path | None, tuple[str, ...]]:
        """(newest checkpoint under `root` that verifies, why each newer one was refused).
        With `quarantine`, once a good one is found the refused newer ones that hold a
        manifest (corrupt, not partial) are renamed `step_N.corrupt` (`quarantine_checkpoint`)."""
        refused: list[tuple[Path, str]] = []
        for path in reversed(_step_dirs(root)):
            try:
                self.verify(path)
            except CorruptCheckpointError as e:
                logger.warning("skipping checkpoint %s: %s", path.name, e)
                refused.append((path, str(e)))
                continue
            if refused:
                logger.warning("using %s, the newest complete checkpoint", path)
                if quarantine:  # a partial one (no manifest) is never counted anyway
                    for bad, _ in refused:
                        if (bad / MANIFEST).is_file():
                            quarantine_checkpoint(bad)
            return path, tuple(why for _, why in refused)
        return None, tuple(why for _, why in refused)

    def resolve(self, path: str | Path | None = None) -> Path:
        """The checkpoint to load: `path` once it verifies; given a checkpoint root (a directory
        of `step_*` directories) or None (this manager's root), the newest one that verifies,
        skipping partial or corrupt ones with a warning; under this manager's own root the
        corrupt ones are renamed `step_N.corrupt` (so retention and later resumes skip them).
        Raises naming the problem otherwise."""
        if path is None and not self.root.exists():
            raise FileNotFoundError(f"no complete checkpoint under {self.root}: it does not exist")
        path = self.root if path is None else Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such checkpoint or checkpoint directory")
        if is_checkpoint_root(path):
            own = path.resolve() == self.root.resolve()  # another run's directory is left as is
            found, refused = self._newest_good(path, quarantine=own)
            if found is None:
                why = "; ".join(refused) if refused else "it holds no step_* directory"
                raise FileNotFoundError(f"no complete checkpoint under {path}: {why}")
            return found
        try:
            self.verify(path)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"{e}. {self._instead_of(path)}") from e
        return path

    def _instead_of(self, damaged: Path) -> str:
        """Which checkpoint to load instead of `damaged`: the newest earlier step that verifies,
        else the newest one beside it that does."""
        deep = self.config.verify == "sha256"
        earlier = earlier_good_checkpoint(damaged, deep=deep)
        if earlier is not None:
            return (
                f"Use an earlier step: the newest complete checkpoint is {earlier} (of those "
                f"before {damaged.name}); pass it, or the checkpoint root {damaged.parent} to "
                "pick the newest that verifies"
            )
        good = self._newest_good(damaged.parent)[0]
        if good is not None and good != damaged:
            return f"No earlier step verifies; {good} does: pass it"
        return (
            f"No other checkpoint under {damaged.parent} verifies: copy this one again from "
            "where it was saved, or start a new run"
        )

    def load(self, path: str | Path | None = None) -> LoadedCheckpoint:
        """Read checkpoint `path` (default: `latest()`) after verifying it."""
        return read_checkpoint(self.resolve(path))


def has_checkpoints(path: str | Path) -> bool:
    """Whether `path` is a checkpoint, or a directory holding `step_*` ones (complete or not)."""
    path = Path(path)
    return path.exists() and (not is_checkpoint_root(path) or bool(_step_dirs(path)))


def is_checkpoint_root(path: str | Path) -> bool:
    """Whether `path` is a directory of checkpoints rather than one checkpoint."""
    path = Path(path)
    if not path.is_dir() or _NAME.match(path.name):
        return False
    return not (path / MANIFEST).exists() and not (path / STATE).exists()


def checkpoint_step(path: str | Path) -> int | None:
    """The step checkpoint `path` holds (its state.json), or for a checkpoint root the step of
    its newest complete checkpoint; None when there is none to read (loading then says why)."""
    path = Path(path)
    if is_checkpoint_root(path):
        complete = complete_checkpoints(path)
        if not complete:
            return None
        path = complete[-1]
    try:
        return int(json.loads((path / STATE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoints_after(root: str | Path, step: int) -> list[Path]:
    """The complete checkpoints under `root` of steps after `step`, oldest first: what
    retention keeps over a run's own newer saves and what a later resume would pick."""
    return [p for p in complete_checkpoints(root) if int(p.name.removeprefix("step_")) > step]


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The checkpoint directories under `root` that hold a manifest (a save that finished),
    oldest first by step."""
    return [p for p in _step_dirs(Path(root)) if (p / MANIFEST).is_file()]


def _step_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    restore_interrupted_resaves(root)
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_tokenizer(model: torch.nn.Module, root: Path) -> Any | None:
    """The tokenizer of the local directory `model` was loaded from, for checkpoints saved
    without `Trainer(tokenizer=...)`; else None, with a warning: such a checkpoint's `model/`
    holds no tokenizer, so it cannot be loaded or served without one."""
    source = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    if source and (Path(source) / "tokenizer_config.json").is_file():
        from ludic.models import load_tokenizer

        return load_tokenizer(source)
    logger.warning(
        "Trainer: checkpoints under %s will hold no tokenizer, so `ludic eval --model "
        "<checkpoint>/model` and load_model cannot load them; pass Trainer(..., "
        "tokenizer=tokenizer)",
        root,
    )
    return None
