"""What `ludic eval` evaluated, recorded beside its results (run.json) and read back by
`ludic view`: the model (its path, checkpoint step, policy version and a digest of its
MANIFEST.json, which lists every weight file's sha256) or the server, and the sampling.

Also the refusal of a checkpoint step whose save never finished (no MANIFEST.json): its weights
may be partial, and nothing could say which files are. This module reads files only (no torch);
it does not verify weights against the manifest (loading does, `ludic.models.loading`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
"""What `ludic eval` writes in --out-dir beside metrics.json: what it evaluated, and how."""

_MANIFEST = (
    "MANIFEST.json"  # ludic.training.checkpoint_manifest.MANIFEST (that module imports torch)
)
_STEP = re.compile(r"^step_(\d+)$")


def checkpoint_step_dir(model: str | Path) -> Path | None:
    """The `step_N` folder a --model names (`.../step_N` or `.../step_N/model`), else None."""
    path = Path(model).expanduser()
    for candidate in (path, path.parent if path.name == "model" else None):
        if candidate is not None and _STEP.match(candidate.name):
            return candidate
    return None


def refuse_unfinished_checkpoint(model: str, *, verify: str) -> None:
    """ValueError when --model names a checkpoint step without its MANIFEST.json (a save that
    was killed before it finished), naming the last complete step to evaluate instead: the
    refusal `load_model` makes, checked before the out-dir and the envs."""
    from ludic.models.checkpoint_step import refuse_unfinished_step  # imports torch: lazily

    refuse_unfinished_step(model, verify=verify, action="evaluate", flag="--model ")


def model_record(model_dir: str) -> dict[str, Any]:
    """The embedded engine's model: its path, and for a training checkpoint its step, policy
    version (state.json) and the sha256 of its MANIFEST.json (one digest for every weight)."""
    record: dict[str, Any] = {"path": str(Path(model_dir).expanduser().resolve())}
    step_dir = checkpoint_step_dir(model_dir)
    if step_dir is None:
        return record
    record["step"] = int(step_dir.name.removeprefix("step_"))
    manifest = step_dir / _MANIFEST
    if manifest.is_file():
        record["manifest_sha256"] = hashlib.sha256(manifest.read_bytes()).hexdigest()
    version = _policy_version(step_dir / "state.json")
    if version is not None:
        record["policy_version"] = version
    return record


def _policy_version(state: Path) -> int | None:
    try:
        version = json.loads(state.read_text())["policy_version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not recorded: the run record leaves it out rather than guess
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def write_run_record(out_dir: Path, record: dict[str, Any]) -> Path:
    path = out_dir / RUN_FILE
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read_run_record(directory: Path) -> dict[str, Any] | None:
    """The run.json `ludic eval` left in `directory`, or None (none there, or unreadable: a
    viewer of the rollouts does not need it)."""
    try:
        record = json.loads((directory / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe_run(record: dict[str, Any]) -> str:
    """One line: the model (or server) and the sampling a run record holds."""
    model = record.get("model") or {}
    if "server_url" in model:
        what = f"{model.get('served_model', '?')} served at {model['server_url']}"
    else:
        what = str(model.get("path", "?"))
        details = [
            f"{key.replace('_', ' ')} {model[key]}"
            for key in ("step", "policy_version")
            if key in model
        ]
        if "manifest_sha256" in model:
            details.append(f"manifest sha256 {model['manifest_sha256'][:12]}")
        what += f" ({', '.join(details)})" if details else ""
    sampling = record.get("sampling") or {}
    how = ", ".join(f"{key.replace('_', '-')} {value}" for key, value in sampling.items())
    seed = f", seed {record['seed']}" if "seed" in record else ""
    return f"{what}; {how}{seed}" if how else what
