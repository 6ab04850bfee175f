"""A checkpoint's MANIFEST.json: every file's size and sha256, written last at save, checked when
the checkpoint is loaded (resume, `ludic eval`, `ludic serve`), so a partial, truncated or
bit-flipped checkpoint is refused naming the damaged file and an earlier step that verifies.

sha256 (hashlib, streamed from the file in one pass) because it is the fastest of hashlib's
digests on CPUs with SHA extensions and was already what manifests recorded. Entries written
before checksums were recorded hold sizes only: those files are checked by size. It does not
choose which checkpoint to load (`CheckpointManager.resolve`) nor rename broken ones
(`checkpoint_faults`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

from ludic.training.weights_io import CorruptCheckpointError

MANIFEST = "MANIFEST.json"
# the step folder's own files that `CheckpointManager.save` writes beside `model/`
SAVED_FILES = ("state.json", "optimizer.pt", "scheduler.pt", "rng.pt", "rank_states.pt")
FORMAT = 1
_STEP_NAME = re.compile(r"^step_(\d+)$")
# a damaged checkpoint may be asked about under its quarantined name too (`quarantine_checkpoint`)
_DAMAGED_NAME = re.compile(r"^step_(\d+)(?:\.corrupt(?:-\d+)?)?$")
_SHA256 = re.compile(r"[0-9a-f]{64}")

VerifyMode = Literal["sha256", "size"]
"""What loading checks against the manifest: "sha256", each file's size and contents (one
streaming pass over the files), or "size", sizes only (fast; a change that keeps a file's size,
such as a flipped bit, passes)."""
VERIFY_MODES: tuple[VerifyMode, ...] = get_args(VerifyMode)


def deep_verify(verify: str) -> bool:
    """The `deep` of `check_files` that `verify` (a `VerifyMode`) asks for; ValueError naming the
    choices for any other value."""
    if verify not in VERIFY_MODES:
        raise ValueError(
            f"verify must be one of {', '.join(VERIFY_MODES)} (sha256: sizes and contents; "
            f"size: sizes only, fast), got {verify!r}"
        )
    return verify == "sha256"


def file_sha256(path: Path) -> str:
    """The hex sha256 of `path`'s bytes, read once in blocks (never the whole file in memory)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, step: int) -> None:
    """fsync every file under `directory`, then write and fsync MANIFEST.json (each file's size
    and sha256) and the directory itself: the manifest's presence marks a finished save."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        fsync_path(path)
        files[path.relative_to(directory).as_posix()] = {
            "size": path.stat().st_size,
            "sha256": file_sha256(path),
        }
    manifest = directory / MANIFEST
    manifest.write_text(json.dumps({"format": FORMAT, "step": step, "files": files}))
    fsync_path(manifest)
    fsync_path(directory)


def manifest_files(directory: Path) -> dict[str, dict[str, Any]]:
    """The `files` table of `directory`'s manifest; CorruptCheckpointError when there is none
    (a save that did not finish) or it cannot be read."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise CorruptCheckpointError(
            f"{directory}: no {MANIFEST}, so the save did not complete (partial checkpoint)"
        )
    try:
        files = json.loads(manifest.read_text())["files"]
        if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
            raise ValueError("'files' is not a table of file entries")
        for name, entry in files.items():
            _check_entry(name, entry)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(
            f"{manifest}: unreadable manifest ({e}); it was edited or damaged after the save"
        ) from e
    return files


def _check_entry(name: str, entry: dict[str, Any]) -> None:
    """ValueError naming what is wrong with manifest entry `name`, as `write_manifest` never
    writes it: a path outside the checkpoint, a size that is no byte count, a sha256 that is
    no hex digest (each compared as is, they would call the file damaged, or a size "123"
    differs from 123 bytes)."""
    path = Path(name)
    if not name or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"entry {name!r} is not a path inside the checkpoint")
    size = entry.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"entry {name!r} has size {size!r}, not a byte count")
    sha = entry.get("sha256")
    if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        raise ValueError(f"entry {name!r} has sha256 {sha!r}, not 64 hex digits")


def check_files(directory: Path, *, deep: bool = True, prefix: str = "") -> None:
    """Raise CorruptCheckpointError naming the first file (of those whose name starts with
    `prefix`) that `directory`'s manifest lists but that is missing, of another size or, with
    `deep`, of other contents than its recorded sha256 (entries without one: size only), or that
    holds trained state (`saved_files`: weights, model configs, the step's own files) but the
    manifest does not list: a manifest that lists fewer files than the save wrote (edited, or
    another save's) would let them load unverified."""
    listed = manifest_files(directory)
    unlisted = [name for name in saved_files(directory, prefix) if name not in listed]
    if unlisted:
        more = f" ({len(unlisted)} files unlisted)" if len(unlisted) > 1 else ""
        raise CorruptCheckpointError(
            f"{directory} is damaged: {unlisted[0]} is not listed in {MANIFEST}{more}, so it "
            "cannot be verified (the manifest was edited, or comes from another save)"
        )
    for name, expected in listed.items():
        if not name.startswith(prefix):
            continue
        file = directory / name
        if not file.is_file():
            raise CorruptCheckpointError(
                f"{directory} is damaged: {name} is listed in {MANIFEST} but missing"
            )
        size = file.stat().st_size
        if size != expected.get("size"):
            raise CorruptCheckpointError(
                f"{directory} is damaged: {name} has {size} bytes, the manifest says "
                f"{expected.get('size')}"
            )
        recorded = expected.get("sha256")
        if deep and recorded is not None and file_sha256(file) != recorded:
            raise CorruptCheckpointError(
                f"{directory} is damaged: {name} does not match its sha256 in {MANIFEST} (its "
                "contents changed after the save: a disk, memory or copy fault)"
            )


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
_MODEL_CONFIGS = ("config.json", "generation_config.json", "adapter_config.json")


def saved_files(directory: Path, prefix: str = "") -> list[str]:
    """The files under `directory` (names relative to it, starting with `prefix`) whose bytes
    make the trained state, so its manifest must list them: the weights and model configs
    under `model/` and the step folder's own files (`SAVED_FILES`). Other files need no entry
    (those the save wrote are listed, so verified, anyway): a tokenizer added later to a
    checkpoint saved without one, a `.DS_Store`, a note a user left beside them; requiring
    them would call the newest step damaged and resume from an older one."""
    names = (
        path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file()
    )
    return sorted(name for name in names if name.startswith(prefix) and _state_file(name))


def _state_file(name: str) -> bool:
    if name in SAVED_FILES:
        return True
    base = name.rsplit("/", 1)[-1]
    if not name.startswith("model/") or base.startswith("."):
        return False
    return base.endswith(_WEIGHT_SUFFIXES) or base in _MODEL_CONFIGS


def earlier_good_checkpoint(path: Path, *, deep: bool = True, prefix: str = "") -> Path | None:
    """The newest `step_N` beside checkpoint `path` (`step_M`) with N < M whose files (those
    under `prefix`) verify: what to load instead of a damaged `path`. None when `path` is not
    named `step_M` (or `step_M.corrupt`) or no earlier one verifies. Only called once `path`
    was refused."""
    match = _DAMAGED_NAME.match(path.name)
    if match is None or not path.parent.is_dir():
        return None
    step = int(match.group(1))
    earlier = [
        (int(m.group(1)), p)
        for p in path.parent.iterdir()
        if (m := _STEP_NAME.match(p.name)) and int(m.group(1)) < step
    ]
    for _, candidate in sorted(earlier, reverse=True):
        try:
            check_files(candidate, deep=deep, prefix=prefix)
        except CorruptCheckpointError:
            continue
        return candidate
    return None
