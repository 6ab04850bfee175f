"""Checkpoints that cannot be used as they are: renaming a corrupt one out of the way
(`quarantine_checkpoint`) and refusing weights that do not fit the model being resumed
(`check_checkpoint_fits`, raising `CheckpointModelMismatchError`), and naming a state.json
or rng.pt that holds what no save writes (`saved_state_problem`) and an optimizer state that
does not fit the optimizer (`check_optimizer_state_fits`). A corrupt checkpoint newer
than the one a run resumes from must leave the `step_*` names: retention would otherwise count it,
keep it and delete the good one resumed from, and every later resume would skip it again.

It does not decide which checkpoint is corrupt (`CheckpointManager.verify` does, and
`CheckpointManager.resolve` calls `quarantine_checkpoint` only under the manager's own root), never
deletes anything (a quarantined checkpoint is kept for inspection), and does not load or restore
weights (`ludic.training.checkpoint.restore_into`). All names are re-exported by
`ludic.training.checkpoint`; warnings go to that module's logger, as before the split.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ludic.training.checkpoint_manifest import earlier_good_checkpoint
from ludic.training.lora import is_lora_model
from ludic.training.parallel.state import fit_state_to_model
from ludic.training.weights_io import CorruptCheckpointError

logger = logging.getLogger("ludic.training.checkpoint")


def quarantine_checkpoint(path: Path) -> Path:
    """Rename corrupt checkpoint `path` to `step_N.corrupt` (`.corrupt-2`, ... if taken), out
    of what listing, retention and resume consider; returns the new path."""
    target = path.with_name(f"{path.name}.corrupt")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{n}")
    os.replace(path, target)
    logger.warning(
        "renamed corrupt checkpoint %s to %s: retention and later resumes skip it (delete it "
        "once inspected)",
        path,
        target.name,
    )
    return target


def check_saved_state(path: Path, state: Any, rng_tensors: Any | None) -> None:
    """Refuse the checkpoint `path` when its state.json or rng.pt is not what a save writes
    (`saved_state_problem`), naming the file, the problem and an earlier step to resume from."""
    problem = saved_state_problem(state, rng_tensors)
    if problem is None:
        return
    file, what = problem
    earlier = earlier_good_checkpoint(path, deep=False)
    instead = f"resume from {earlier}" if earlier is not None else "start a new run"
    raise CorruptCheckpointError(
        f"{path / file}: {what}, which a save never writes: the file was edited after the "
        f"save. Restore it, or {instead}"
    )


def saved_state_problem(state: Any, rng_tensors: Any | None) -> tuple[str, str] | None:
    """(file, what is wrong) when a checkpoint's state.json (`state`, parsed) or rng.pt
    (`rng_tensors`, loaded; None when absent) is not what a save writes: read as they are, they
    raised a bare TypeError or ValueError mid-resume. A manifest rewritten after an edit lets
    such files verify."""
    if not isinstance(state, dict):
        return "state.json", f"a JSON {type(state).__name__}, not an object"
    for key in ("step", "policy_version"):
        value = state.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return "state.json", f"{key} is {value!r}, not an int >= 0"
    for key in ("data_state", "extra"):
        if not isinstance(state.get(key, {}), dict):
            return "state.json", f"{key} is a JSON {type(state[key]).__name__}, not an object"
    rng = state.get("rng")
    if rng is not None and not (isinstance(rng, dict) and {"python", "numpy"} <= rng.keys()):
        return "state.json", "rng is not the python and numpy RNG states"
    if rng_tensors is None:
        return None
    saved = rng_tensors.get("torch") if isinstance(rng_tensors, dict) else None
    if not isinstance(saved, torch.Tensor) or saved.dtype != torch.uint8:
        return "rng.pt", "it holds no torch RNG state (a uint8 tensor under 'torch')"
    return None


class CheckpointModelMismatchError(ValueError):
    """A checkpoint's weights do not fit the model it is loaded into (another architecture or
    size): the message names the checkpoint, the model and the first differing tensor."""


def check_checkpoint_fits(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], checkpoint: Path
) -> None:
    """Raise `CheckpointModelMismatchError` unless `state` (checkpoint `checkpoint`'s weights)
    has the keys and shapes of `model`'s (global shapes, also when sharded). Resuming needs the
    model the run started from; the message says so instead of torch's state-dict dump. Weights
    holding a NaN or an inf raise `CorruptCheckpointError`."""
    source = getattr(getattr(model, "config", None), "_name_or_path", "") or "the model given"
    fix = _lora_fix(model, state) or (
        f"Resume with the model the run started from (`ludic train --model`, or the model "
        f"passed to the Trainer; this one is {source}), or start a new run without --resume "
        f"(another --out-dir)"
    )
    try:
        fitted, _ = fit_state_to_model(model, state)
    except ValueError as e:
        raise CheckpointModelMismatchError(
            f"{checkpoint} does not fit the model: {e}. {fix}"
        ) from e
    own = model.state_dict()
    differ = [k for k, v in own.items() if k in fitted and fitted[k].shape != v.shape]
    if differ:
        first = differ[0]
        raise CheckpointModelMismatchError(
            f"{checkpoint} does not fit the model: {first} is {list(fitted[first].shape)} in "
            f"the checkpoint but {list(own[first].shape)} in the model ({len(differ)} of "
            f"{len(fitted)} tensors differ in shape). {fix}"
        )
    _check_finite(state, checkpoint)


def _check_finite(state: Mapping[str, torch.Tensor], checkpoint: Path) -> None:
    """CorruptCheckpointError naming the first tensor of `state` holding a NaN or an inf (an
    edited file: a run refuses to publish such weights), and an earlier step that verifies:
    resuming from it would train on NaN logits, every step skipped as non-finite."""
    from ludic.distributed.checksum import nonfinite

    bad = nonfinite(state)
    if not bad:
        return
    earlier = earlier_good_checkpoint(checkpoint)
    instead = f"the earlier step {earlier}" if earlier is not None else "another checkpoint"
    raise CorruptCheckpointError(
        f"{checkpoint}: the saved weights hold NaN or inf values ({bad[0]}; {len(bad)} "
        f"tensor(s)), so training from them cannot make progress: resume from {instead}"
    )


_PARAMETER_SHAPED = frozenset(
    {
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "momentum_buffer",
        "square_avg",
        "grad_avg",
        "acc_delta",
        "sum",
        "ax",
        "exp_inf",
        "prev",
        "step_size",
    }
)
"""torch optimizers' per-parameter state that has the parameter's shape (Adam(W), SGD, RMSprop,
Adadelta, Adagrad, ASGD, Adamax, Rprop); others' (Adafactor's factored moments) need not."""


def check_optimizer_state_fits(
    optimizer: torch.optim.Optimizer, state: Mapping[str, Any], checkpoint: Path
) -> None:
    """Raise `CheckpointModelMismatchError` unless checkpoint `checkpoint`'s optimizer state
    (the single-process `optimizer.state_dict()` layout) has `optimizer`'s groups, each of its
    size, and per-parameter tensors (Adam's moments) of each parameter's shape. torch checks
    only the group sizes, and a moment of another shape (an optimizer.pt from another model)
    failed at the first step after the resume."""
    saved_groups = state.get("param_groups") or []
    saved_state = state.get("state") or {}
    live = [group["params"] for group in optimizer.param_groups]
    sizes = [len(group.get("params", [])) for group in saved_groups]
    problem = None
    if sizes != [len(params) for params in live]:
        problem = (
            f"parameter groups of {sizes} parameters, the optimizer's {[len(p) for p in live]}"
        )
    else:
        pairs = (
            (index, param)
            for group, params in zip(saved_groups, live, strict=True)
            for index, param in zip(group["params"], params, strict=True)
        )
        for index, param in pairs:
            for key, value in (saved_state.get(index) or {}).items():
                if key not in _PARAMETER_SHAPED:  # e.g. Adafactor's factored row_var/col_var
                    continue
                if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                    problem = (
                        f"{key} of parameter {index} is {list(value.shape)}, the parameter "
                        f"{list(param.shape)}"
                    )
                    break
            if problem is not None:
                break
    if problem is not None:
        raise CheckpointModelMismatchError(
            f"{checkpoint / 'optimizer.pt'} does not fit this model's optimizer: {problem}. It "
            "comes from another model or was edited after the save: restore it, or resume from "
            "another checkpoint"
        )


def _lora_fix(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> str | None:
    """The fix when only LoRA differs: a full-parameter checkpoint into a LoRA-wrapped model, or
    a LoRA adapter checkpoint into a plain one (`add_lora` added or dropped between runs)."""
    saved_lora = any("lora_" in key for key in state)
    if is_lora_model(model) and not saved_lora:
        return (
            "The checkpoint holds a full-parameter run's weights but this model is LoRA-wrapped "
            "(add_lora): resume it without add_lora, as that run trained, or start a LoRA run "
            "from its weights in another checkpoint directory (load_model on the checkpoint's "
            "model/ folder, then add_lora)"
        )
    if saved_lora and not is_lora_model(model):
        return (
            "The checkpoint holds a LoRA adapter but this model is not LoRA-wrapped: wrap the "
            "base model with add_lora (same rank, alpha and target modules) before resuming, as "
            "that run did"
        )
    return None
