"""`--out-dir` / `--resume` checks `ludic train` and `ludic sft` run before the model loads:
an OUT_DIR holding an earlier run's checkpoints without `--resume`, a `--resume` that names
nothing or a checkpoint older than others beside it, and which checkpoint `--resume` means.
Re-exported by `ludic.recipes.training`."""

from __future__ import annotations

from pathlib import Path

from ludic.recipes.configs import RESUME_LATEST
from ludic.recipes.resume_refusal import CHECKPOINTS_DIR, no_checkpoint_message
from ludic.training.checkpoint import (
    STATE,
    checkpoint_step,
    checkpoints_after,
    complete_checkpoints,
    is_checkpoint_root,
)
from ludic.training.checkpoint_manifest import check_files
from ludic.training.weights_io import CorruptCheckpointError


def refuse_earlier_checkpoints(out_dir: Path, *, fix: str) -> None:
    """FileExistsError when `out_dir` holds an earlier run's checkpoints: a new run there would
    mix its logs with that run's, and checkpoint retention (newest steps kept) would delete
    this run's own checkpoints, the final one included, keeping the earlier run's. `fix` is
    the sentence saying what to do instead."""
    steps = complete_checkpoints(out_dir / CHECKPOINTS_DIR)
    if steps:
        raise FileExistsError(
            f"{out_dir} holds an earlier run's checkpoints (newest: {steps[-1].name}); a new "
            f"run there would mix its logs (metrics.jsonl, ...) with that run's, and keeping "
            f"the newest checkpoints would delete this run's own. {fix}"
        )


def check_run_dir(out_dir: Path, resume: str | None) -> None:
    """`--out-dir` / `--resume` before the model loads, as `ludic train` and `ludic sft` run
    it: without `resume`, an OUT_DIR holding an earlier run's checkpoints is refused
    (`refuse_earlier_checkpoints`); with `--resume PATH`, `check_resume_dir`."""
    if resume is None:
        refuse_earlier_checkpoints(
            out_dir,
            fix=f"Pass --resume to continue that run (--steps counts the whole run), or another "
            f"--out-dir for a new one (or delete {out_dir}).",
        )
        return
    check_resume_dir(out_dir, resume)


def check_resume_dir(out_dir: Path, resume: str | None) -> None:
    """Refuse `--resume PATH` whose checkpoint is older than complete ones in OUT_DIR (another
    run's, or the stretch this resume discards): this run's saves would land among them,
    retention would keep those, and a later `--resume` would pick them. A damaged newer one
    (its files do not match its manifest) is no such step: a later bare `--resume` sets it
    aside, and this run's save of that step replaces it. A bare `--resume` takes OUT_DIR's
    newest, so it never is; no `--resume` is not checked here. A PATH that does not exist (a
    typo) is refused here too, naming OUT_DIR's newest checkpoint, before the model loads, and
    so is a bare `--resume` where OUT_DIR holds no checkpoint at all (a run stopped before its
    first save: with `--checkpoint-every None` only its end saves one)."""
    if resume is None:
        return
    if resume == RESUME_LATEST:
        _refuse_nothing_to_resume(out_dir)
        return
    if not Path(resume).exists():  # a typo: refused before the model loads, not after
        raise FileNotFoundError(
            no_checkpoint_message(
                f"{resume}: no such checkpoint or checkpoint directory", out_dir, latest=False
            )
        )
    if (step := checkpoint_step(resume)) is None:
        return
    root = out_dir / CHECKPOINTS_DIR
    stale = [p for p in checkpoints_after(root, step) if _intact(p)]
    if stale:
        names = ", ".join(p.name for p in stale)
        raise FileExistsError(
            f"--resume {resume} is at step {step}, but {root} holds newer checkpoints "
            f"({names}), from another run or the stretch this resume discards: a later "
            f"--resume would pick {stale[-1].name} over this run's own steps. Delete them "
            f"(rm -r {' '.join(str(p) for p in stale)}) to continue from step {step} here, "
            f"or pass another --out-dir."
        )


def _refuse_nothing_to_resume(out_dir: Path) -> None:
    """A bare `--resume` on an OUT_DIR without a single checkpoint folder is refused before
    the model loads (and `--local-server` starts its server): the trainer's resume refused it
    only after both. Folders that are there but damaged or incomplete are the trainer's to
    judge, in its words."""
    root = out_dir / CHECKPOINTS_DIR
    if root.is_dir() and any(root.iterdir()):
        return
    reason = f"no complete checkpoint under {root}: it does not exist"
    if root.is_dir():
        reason = f"no checkpoint under {root}: it is empty"
    hint = (
        " (a run stopped before its end saves checkpoints only every --checkpoint-every "
        "steps, none by default)"
    )
    raise FileNotFoundError(no_checkpoint_message(reason + hint, out_dir))


def _intact(checkpoint: Path) -> bool:
    """Whether a later `--resume` would load `checkpoint`: every file has its manifest's size
    (sizes only: hashing every newer checkpoint before the model loads would take minutes for
    a large model; one damaged within its sizes still counts as intact here)."""
    try:
        check_files(checkpoint, deep=False)
    except CorruptCheckpointError:
        return False
    return True


def resume_target(out_dir: Path, resume: str | None) -> Path | None:
    """The checkpoint `--resume` names (a bare `--resume`: OUT_DIR's newest complete one; a
    directory of checkpoints: its newest), or None when there is none readable (the
    trainer's resume then says why)."""
    if resume is None:
        return None
    path = out_dir / CHECKPOINTS_DIR if resume == RESUME_LATEST else Path(resume)
    if is_checkpoint_root(path):
        found = complete_checkpoints(path)
        return found[-1] if found else None
    return path if (path / STATE).is_file() else None
