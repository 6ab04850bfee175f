"""The checkpoint step folder a model path names, and the refusal of one whose save never
finished (no MANIFEST.json): its weights may be partial, and nothing could say which files are.

Shared by `load_model` (so `ludic serve`, `ludic train` and every other caller refuse it) and
`ludic eval`. It reads files only (no torch here; the `ludic.models` package imports torch, so
torch-free command paths import this module where they are about to load a model).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MANIFEST = "MANIFEST.json"  # ludic.training.checkpoint_manifest.MANIFEST (that imports torch)
_STEP = re.compile(r"^step_(\d+)$")


def checkpoint_step_dir(path: str | os.PathLike[str]) -> Path | None:
    """The `step_N` folder `path` names (`.../step_N` or `.../step_N/model`), else None."""
    resolved = Path(path).expanduser()
    for candidate in (resolved, resolved.parent if resolved.name == "model" else None):
        if candidate is not None and _STEP.match(candidate.name):
            return candidate
    return None


def refuse_unfinished_step(
    path: str | os.PathLike[str], *, verify: str, action: str = "load", flag: str = ""
) -> None:
    """ValueError when `path` names a checkpoint step without its MANIFEST.json (a save that
    was killed before it finished: resume skips such a step), naming the newest earlier step
    whose model verifies (checked as `verify`, a `VerifyMode`, says), the one to `action`
    instead. `flag` (e.g. "--model "): how the user passed the path, to name it as given."""
    step_dir = checkpoint_step_dir(path)
    if step_dir is None or not step_dir.is_dir() or (step_dir / MANIFEST).is_file():
        return
    if not _checkpoint_layout(step_dir):
        return  # a model another tool saved in a folder named step_N: a model, loaded as such
    from ludic.training.checkpoint_manifest import deep_verify, earlier_good_checkpoint

    earlier = earlier_good_checkpoint(step_dir, deep=deep_verify(verify), prefix="model/")
    instead = (
        f"{action} the last complete step instead: {flag}{earlier / 'model'}"
        if earlier is not None
        else f"no earlier step beside it is complete; {action} another run's checkpoint"
    )
    named = f"{flag}{path}: " if flag else ""
    raise ValueError(
        f"{named}{step_dir} has no {MANIFEST}, so its save did not finish (it was interrupted) "
        f"and its weights may be partial; {instead}. A model saved outside a training run loads "
        "from a folder of its own: copy its model/ out of checkpoints/ first"
    )


def _checkpoint_layout(step_dir: Path) -> bool:
    """Whether `step_dir` is laid out as a training checkpoint step (its weights in `model/`, or
    the trainer's `state.json` beside them), not a model folder that happens to be named step_N
    (config.json and weights at its top, as Hugging Face trainers and other tools save them)."""
    return (step_dir / "model").is_dir() or (step_dir / "state.json").is_file()
