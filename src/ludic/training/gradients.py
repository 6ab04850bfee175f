"""One optimizer batch's gradients, accumulated over micro-batches so that the result equals
one big batch: every micro-batch's loss is normalised by batch-wide totals (see
`algorithm_types.Aggregation`) and the backward passes simply add up.

Across data-parallel ranks the totals are summed over ranks and every rank runs the same number
of passes (`num_passes`): a rank with fewer micro-batches (or none) runs zero-gradient dummy
passes that make the same model calls as a real pass (the reference model's too, which may be
sharded), so FSDP's collectives stay matched. It does not step an optimizer, clip or check
gradients (the Trainer does that). Besides the loss's metrics it reports the train/inference
mismatch (`mismatch/...`, see `mismatch.py`) whenever the batch has behaviour logprobs.
A non-finite micro-batch loss is reported and never
back-propagated: alone, the function stops there; with `num_passes`, that pass back-propagates
zero instead and the remaining passes still run.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ludic.training.algorithm_types import Loss, LossInputs
from ludic.training.collate import CollatedBatch, shared_prefix_groups
from ludic.training.logprobs import DEFAULT_CHUNK_TOKENS, sequence_logprobs
from ludic.training.lora import adapters_disabled
from ludic.training.losses import reduce_metrics
from ludic.training.mismatch import mismatch_metrics


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchTotals:
    """What losses normalise by: action tokens and sequences of the whole optimizer batch
    (summed over ranks in data-parallel training)."""

    action_tokens: float
    sequences: float

    @staticmethod
    def of(batch: CollatedBatch) -> BatchTotals:
        return BatchTotals(
            action_tokens=float(batch.num_action_tokens), sequences=float(batch.num_sequences)
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class AccumulationResult:
    """`loss` is the batch loss (sum of micro-batch shares); `metrics` are the loss metrics
    reduced over micro-batches; `finite` is False when some micro-batch loss was nan/inf (the
    micro-batches after it were not run and gradients are incomplete)."""

    loss: float
    finite: bool
    num_micro_batches: int
    metrics: dict[str, float] = field(default_factory=dict)


def accumulate_gradients(
    model: torch.nn.Module,
    loss_fn: Loss,
    batch: CollatedBatch | None,
    micro_batches: Sequence[Sequence[int]],
    *,
    totals: BatchTotals | None = None,
    num_passes: int | None = None,
    pad_token_id: int = 0,
    ref_model: torch.nn.Module | None = None,
    packed: bool = False,
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    batch_invariant: bool = False,
    shared_prefix_min_tokens: int | None = None,
    shared_passes: Sequence[bool] | None = None,
) -> AccumulationResult:
    """Forward and backward every micro-batch (rows of `batch`) into `model`'s `.grad`.

    The caller zeroes gradients first. `totals` (default: those of `batch`) are passed to the
    loss, so the accumulated gradient does not depend on the split. `num_passes` (>= the number
    of micro-batches) pads with dummy passes that add exactly zero gradient; `batch` may then be
    None (this rank has nothing to train on). `batch_invariant` computes the policy's logprobs
    with the batch-invariant engine's arithmetic (`sequence_logprobs`); `shared_prefix_min_tokens`
    runs rows' shared prompts once (`sequence_logprobs`, policy and reference model alike).
    `shared_passes` (one flag per pass, the same on every rank: `agreed_shared_passes`) makes
    pass i take the shared path exactly when flag i is set, dummy passes included, so every
    rank makes the same model calls; None lets each micro-batch choose for itself.
    `ref_model` may be `model` itself when that is a LoRA model: its base (adapters disabled)
    is then the reference.
    """
    if loss_fn.needs_ref_logprobs and ref_model is None:
        raise ValueError(
            "the loss needs reference-model logprobs (a KL term) but no ref_model was given; "
            "pass ref_model= to the Trainer or drop the KL term"
        )
    if batch_invariant and _sharded(model):
        raise ValueError(
            "batch_invariant=True needs the whole model on this rank (the batch-invariant "
            "forward reads every weight itself) but the model is FSDP-sharded; turn "
            "batch_invariant off under torchrun"
        )
    if totals is None:
        if batch is None:
            raise ValueError("accumulate_gradients: batch=None needs explicit totals")
        totals = BatchTotals.of(batch)
    if totals.action_tokens <= 0:
        raise ValueError("accumulate_gradients: the batch has no action tokens to train on")
    lockstep = num_passes is not None
    passes = len(micro_batches) if num_passes is None else num_passes
    if passes < len(micro_batches) or (batch is None and micro_batches):
        raise ValueError(
            f"accumulate_gradients: num_passes={num_passes} for {len(micro_batches)} "
            "micro-batches (of a batch that must be given when there are micro-batches)"
        )
    if shared_passes is not None and len(shared_passes) != passes:
        raise ValueError(
            f"accumulate_gradients: {len(shared_passes)} shared_passes flags for {passes} passes"
        )
    device = torch.device(device)
    loss_sum, finite, per_micro_batch = 0.0, True, []
    for done in range(passes):
        shared = None if shared_passes is None else bool(shared_passes[done])
        if done >= len(micro_batches):
            dummy = _dummy_batch(pad_token_id).to(device)
            _zero_pass(model, ref_model, loss_fn, dummy, device, autocast_dtype, bool(shared))
            continue
        assert batch is not None
        micro = batch.select(micro_batches[done]).to(device)
        with _autocast(device, autocast_dtype):
            logprobs_BT, entropy_BT, ref_BT = _forward(
                model,
                ref_model,
                loss_fn,
                micro,
                packed=packed,
                chunk_tokens=chunk_tokens,
                batch_invariant=batch_invariant,
                shared_prefix_min_tokens=shared_prefix_min_tokens,
                shared_path=shared,
            )
        out = loss_fn(
            LossInputs(
                logprobs_BT=logprobs_BT,
                action_mask_BT=micro.action_mask_BT,
                advantages_B=micro.advantages_B,
                total_action_tokens=totals.action_tokens,
                total_sequences=totals.sequences,
                behavior_logprobs_BT=micro.behavior_logprobs_BT,
                ref_logprobs_BT=ref_BT,
                entropy_BT=entropy_BT,
            )
        )
        metrics = dict(out.metrics)
        if micro.behavior_logprobs_BT is not None:
            metrics.update(
                mismatch_metrics(
                    logprobs_BT,
                    micro.behavior_logprobs_BT,
                    micro.action_mask_BT,
                    total_action_tokens=totals.action_tokens,
                )
            )
        value = float(out.loss.detach().item())
        if not math.isfinite(value):
            if not lockstep:
                return AccumulationResult(
                    loss=value, finite=False, num_micro_batches=done + 1, metrics={}
                )
            finite, loss_sum = False, value
            (logprobs_BT * 0.0).sum().backward()  # keeps the collectives, adds no gradient
            continue
        out.loss.backward()
        if finite:
            loss_sum += value
        per_micro_batch.append(metrics)
    return AccumulationResult(
        loss=loss_sum,
        finite=finite,
        num_micro_batches=passes,
        metrics=reduce_metrics(per_micro_batch) if finite else {},
    )


def _forward(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    loss_fn: Loss,
    micro: CollatedBatch,
    *,
    packed: bool,
    chunk_tokens: int,
    batch_invariant: bool = False,
    shared_prefix_min_tokens: int | None = None,
    shared_path: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(logprobs_BT, entropy_BT if the loss needs it, reference logprobs_BT if it needs them)."""
    logprobs_BT, entropy_BT = sequence_logprobs(
        model,
        micro,
        packed=packed,
        with_entropy=loss_fn.needs_entropy,
        chunk_tokens=chunk_tokens,
        batch_invariant=batch_invariant,
        shared_prefix_min_tokens=shared_prefix_min_tokens,
        shared_path=shared_path,
    )
    ref_BT = None
    if ref_model is not None and loss_fn.needs_ref_logprobs:
        # the policy as its own reference: a LoRA model run as its base (`Trainer`'s ref_model)
        base = adapters_disabled(model) if ref_model is model else contextlib.nullcontext()
        with torch.no_grad(), base:
            ref_BT, _ = sequence_logprobs(
                ref_model,
                micro,
                packed=packed,
                chunk_tokens=chunk_tokens,
                shared_prefix_min_tokens=shared_prefix_min_tokens,
                shared_path=shared_path,
            )
    return logprobs_BT, entropy_BT, ref_BT


def local_shared_passes(
    model: torch.nn.Module,
    batch: CollatedBatch | None,
    micro_batches: Sequence[Sequence[int]],
    *,
    passes: int,
    min_tokens: int | None,
    packed: bool = False,
    device: torch.device | str = "cpu",
) -> list[float]:
    """1.0 for each pass whose micro-batch would take the shared path on this rank, else 0.0
    (dummy passes, no `min_tokens`). Sum them over ranks and pass `flag > 0` as
    `accumulate_gradients(shared_passes=...)`: a pass shares on every rank or on none."""
    flags = [0.0] * passes
    if min_tokens is None or batch is None:
        return flags
    from ludic.training.shared_prefix import takes_shared_path

    for i, rows in enumerate(micro_batches):
        micro = batch.select(rows)
        groups = shared_prefix_groups(micro, min_tokens=min_tokens)
        flags[i] = float(takes_shared_path(model, micro, groups, packed=packed))
    return flags


def _sharded(model: torch.nn.Module) -> bool:
    """Whether `model` holds DTensor (FSDP2-sharded) parameters (none unless DTensor was
    imported, which this check does not do: it takes about a second)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and any(isinstance(p, dtensor.DTensor) for p in model.parameters())


def _dummy_batch(pad_token_id: int) -> CollatedBatch:
    """Two padding tokens, nothing to train on."""
    return CollatedBatch(
        input_ids_BT=torch.full((1, 2), pad_token_id, dtype=torch.long),
        attention_mask_BT=torch.ones((1, 2), dtype=torch.long),
        action_mask_BT=torch.zeros((1, 2)),
        advantages_B=torch.zeros(1),
    )


def _zero_pass(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    loss_fn: Loss,
    dummy: CollatedBatch,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    shared: bool,
) -> None:
    """A forward and backward through every parameter that adds exactly zero gradient, making
    the model calls a real pass makes: the policy's and, when the loss needs it, the reference
    model's (a sharded reference all-gathers too); with `shared`, the shared path's two calls
    each (as the ranks that share make)."""
    with _autocast(device, autocast_dtype):
        logprobs_BT, _, _ = _forward(
            model,
            ref_model,
            loss_fn,
            dummy,
            packed=False,
            chunk_tokens=DEFAULT_CHUNK_TOKENS,
            shared_prefix_min_tokens=2 if shared else None,
            shared_path=shared or None,
        )
    (logprobs_BT * 0.0).sum().backward()


def _autocast(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[object]:
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
