"""Rollouts as JSON Lines: one `Rollout.to_dict()` per line, and the reader that inverts it.

Deliberately plain: no compression, no schema versioning, no pickling (files may come from
elsewhere). A truncated last line (a run killed mid-write) is reported, never silently skipped,
and so is a line that is not a rollout: naming the file and line, and, for Ludic's other JSONL
files (samples.jsonl, metrics.jsonl, an eval's episodes/steps.jsonl), what the file is and what
to do with it.
Files are valid UTF-8: text is written as is, except a record holding a lone surrogate (code
point U+D800 to U+DFFF, which model replies and env text can contain): that line is written
with ASCII JSON escapes, which read back to the same string.
"""

from __future__ import annotations

import codecs
import datetime
import json
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from ludic._jsonl_errors import undecodable_line
from ludic.types import Rollout


def rollout_to_line(rollout: Rollout) -> str:
    """One JSON line (with trailing newline) for `rollout`, always encodable as UTF-8."""
    record = rollout.to_dict()
    try:
        line = json.dumps(record, ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escape it (lossless), keep the file UTF-8
            line = json.dumps(record, ensure_ascii=True)
        return line + "\n"
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"rollout {rollout.id} is not JSON-serialisable ({e}); keep step info and rollout "
            "meta to JSON values (str, int, float, bool, None, lists and dicts of them)"
        ) from e


def write_rollouts_jsonl(rollouts: Iterable[Rollout], dest: IO[str] | str | Path) -> int:
    """Write rollouts one per line to `dest`: an open text stream, or a file path (created
    with its parent folders, or overwritten). Returns how many were written. Like `json.dump`,
    the data comes first and the destination second (as in `append_rollouts_jsonl`)."""
    rollouts, dest = _data_first(rollouts, dest, "write_rollouts_jsonl")
    if isinstance(dest, str | Path):
        lines = [rollout_to_line(r) for r in rollouts]
        path = Path(dest)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(lines), encoding="utf-8")
        return len(lines)
    n = 0
    for rollout in rollouts:
        dest.write(rollout_to_line(rollout))
        n += 1
    return n


def append_rollouts_jsonl(rollouts: Iterable[Rollout], path: str | Path) -> int:
    """Append rollouts to the file at `path` (created with its parent folders if needed). Every
    line is serialised before the file is touched, so a rollout that cannot be serialised
    leaves the file as it was. Returns how many were written."""
    rollouts, path = _data_first(rollouts, path, "append_rollouts_jsonl")
    lines = [rollout_to_line(r) for r in rollouts]
    path = Path(path)  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(lines))
    return len(lines)


def set_aside_earlier_log(path: str | Path) -> Path | None:
    """Rename a non-empty rollout log at `path` to a dated name beside it, `STEM.YYYYmmdd-HHMMSS
    .jsonl` (when it was last written, local time; `-2`, `-3`, ... if taken), so the run about
    to write `path` starts a fresh file instead of mixing its rollouts with an earlier run's.
    Returns the new name, or None when there was nothing to keep (no file, or an empty one)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    kept = dated_sibling(path, path.stat().st_mtime)
    path.rename(kept)
    return kept


def dated_sibling(path: Path, when: float, *, keep_suffix: bool = True) -> Path:
    """A free name beside `path` stamped with `when` (local time): `STEM.YYYYmmdd-HHMMSS
    SUFFIX`, or `NAME.YYYYmmdd-HHMMSS` without `keep_suffix` (a folder); `-2`, `-3`, ... after
    the stamp when that name is taken. Where an earlier run is kept when a rerun replaces it."""
    stamp = datetime.datetime.fromtimestamp(when).strftime("%Y%m%d-%H%M%S")
    stem, suffix = (path.stem, path.suffix) if keep_suffix else (path.name, "")
    kept = path.with_name(f"{stem}.{stamp}{suffix}")
    n = 1
    while kept.exists():
        n += 1
        kept = path.with_name(f"{stem}.{stamp}-{n}{suffix}")
    return kept


def _data_first(first: Any, second: Any, name: str) -> tuple[Any, Any]:
    """Accept the old destination-first call (`append_rollouts_jsonl(path, rollouts)`) with a
    DeprecationWarning; the order is (rollouts, destination)."""
    if _is_destination(first) and not _is_destination(second):
        warnings.warn(
            f"{name}(destination, rollouts) is deprecated: pass the rollouts first, then the "
            "destination, as in json.dump",
            DeprecationWarning,
            stacklevel=3,
        )
        return second, first
    return first, second


def _is_destination(value: object) -> bool:
    return isinstance(value, str | Path) or hasattr(value, "write")


def iter_rollouts_jsonl(path: str | Path) -> Iterator[Rollout]:
    """Yield the rollouts of a JSONL file in order; blank lines are skipped, and so is a UTF-8
    byte order mark at its start (an editor's). A line that is not UTF-8 is refused naming
    the file, the line and, for a compressed or UTF-16 file, what it is."""
    with Path(path).open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(_not_utf8(path, lineno, raw, e)) from e
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                episodes = Path(path).parent / "rollouts.jsonl"
                advice = f". That eval's episodes are in {episodes}: `ludic view {episodes}`"
                raise ValueError(
                    undecodable_line(path, lineno, line, e, "rollout record", advice)
                ) from e
            yield _rollout_from_record(record, path, lineno)


def _not_utf8(path: str | Path, lineno: int, raw: bytes, error: UnicodeDecodeError) -> str:
    """Why line `lineno` of `path` (`raw`) does not decode, and what to do."""
    head = f"{path}:{lineno}: not UTF-8 text (byte {raw[error.start]:#04x} at byte {error.start})"
    if lineno == 1 and raw.startswith(b"\x1f\x8b"):
        return f"{head}: the file is gzip-compressed; decompress it (gunzip) and pass that file"
    if lineno == 1 and raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return (
            f"{head}: the file is UTF-16 text; re-encode it as UTF-8 (`iconv -f UTF-16 -t "
            "UTF-8`), as Ludic writes rollouts"
        )
    return f"{head}: the line is damaged; drop it, or write the file again as UTF-8"


def _rollout_from_record(record: Any, path: str | Path, lineno: int) -> Rollout:
    """`Rollout.from_dict(record)`, or a ValueError naming `path:lineno`, saying a rollouts
    JSONL is expected and, for Ludic's other JSONL files (training samples, metrics, eval
    summaries), what the file is and what to do with it instead."""
    other = None if _is_rollout_record(record) else _other_file(record, Path(path))
    if other is None:
        try:
            return Rollout.from_dict(record)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            other = (f"a broken rollout record ({type(e).__name__}: {e})", "")
    kind, advice = other
    raise ValueError(
        f"{path}:{lineno}: {kind}, but a rollouts JSONL is expected here (one Rollout.to_dict() "
        "per line, with 'id' and 'steps': the rollouts.jsonl of `ludic train` or `ludic "
        f"eval`, or a RolloutEngine jsonl_log){advice}"
    )


def _is_rollout_record(record: Any) -> bool:
    return isinstance(record, dict) and "id" in record


def _other_file(record: Any, path: Path) -> tuple[str, str]:
    """(what a non-rollout line is, what to do instead), naming the other JSONL files Ludic
    writes."""
    if not isinstance(record, dict):
        return f"not a JSON object (a {type(record).__name__})", ""
    rollouts = path.parent / "rollouts.jsonl"
    beside = rollouts.is_file()  # else the advice names the file it is looking for
    where = str(rollouts) if beside else "the rollouts.jsonl written with it (none is beside it)"
    if "input_ids" in record and "action_mask" in record:
        view = f"ludic view {rollouts if beside else '<rollouts.jsonl>'} --samples {path}"
        return "a training sample (SAWItem.to_dict(), as in samples.jsonl)", (
            f". The rollouts these samples came from are in {where}; to show the samples' "
            f"weights, give both to the viewer: `{view}`"
        )
    if "step" in record and "id" not in record and "steps" not in record:
        return "a training metrics record (as in metrics.jsonl)", (
            f". To see its curves, plot it: `ludic plot {path}`"
        )
    if "rollout_id" in record and ("total_reward" in record or "turn_index" in record):
        return "an eval summary record (episodes.jsonl or steps.jsonl of `ludic eval`)", (
            f". That eval's rollouts are in {where}"
        )
    keys = ", ".join(repr(k) for k in list(record)[:8])
    return f"a record without an 'id' (keys: {keys or 'none'})", ""


def read_rollouts_jsonl(path: str | Path) -> list[Rollout]:
    """All rollouts of a JSONL file written by `write_rollouts_jsonl`, `append_rollouts_jsonl`
    or the engine's `jsonl_log`."""
    return list(iter_rollouts_jsonl(path))
