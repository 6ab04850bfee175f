"""What `ludic train` and `ludic sft` say when `--resume` finds no checkpoint to continue: how
to start a new run instead. Running without `--resume` is that way only when OUT_DIR holds no
complete checkpoint (damaged ones included), since `check_run_dir` refuses such an OUT_DIR.

It does not decide which checkpoint is usable (`CheckpointManager.resolve` does)."""

from __future__ import annotations

from pathlib import Path

from ludic.training.checkpoint import complete_checkpoints

CHECKPOINTS_DIR = "checkpoints"
"""Where a run's checkpoints live under its OUT_DIR."""


def no_checkpoint_message(reason: str, out_dir: Path, *, latest: bool = True) -> str:
    """The refusal of a `--resume` that found no checkpoint to continue (`reason`, the loader's
    words), naming how to start a new run from this OUT_DIR. `latest`: whether it asked for
    the newest one (`--resume latest`); a path that is not a checkpoint (a typo) while OUT_DIR
    holds some is pointed at those first, never told to delete them."""
    saved = complete_checkpoints(out_dir / CHECKPOINTS_DIR)
    if saved and not latest:
        return (
            f"--resume: {reason}; {out_dir} holds {saved[-1].name} (the newest): pass --resume "
            "latest, or the path of one of its checkpoints, to continue; to start a new run, "
            "pass another --out-dir"
        )
    if saved:
        return (
            f"--resume: {reason}; to start a new run, pass another --out-dir (or delete "
            f"{out_dir}): without --resume, {out_dir} is refused too, as it holds these "
            "checkpoints"
        )
    return f"--resume: {reason}; run without --resume to start a new run"
