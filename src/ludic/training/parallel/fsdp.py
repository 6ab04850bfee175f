"""FSDP2 data parallelism for one torchrun rank: process-group setup from torchrun's environment
(gloo on CPU, NCCL on CUDA), `fully_shard` wrapping, cross-rank agreements, and full-state
gather/broadcast through DCP's state-dict API (so checkpoints do not depend on world size).

Gradients are summed over ranks (not averaged): each rank's loss is already normalised by
batch-wide totals summed over ranks. A reference model (KL losses) is sharded too, frozen
(`prepare_reference_model`: rank 0's weights, `shard_model(ref, frozen=True)`; one the caller
sharded already is left as it is), and every rank runs every reference forward, dummy passes
included. It does not do tensor/pipeline parallelism or sharded (DCP `save`) checkpoints.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ludic.distributed.interfaces import Weights
from ludic.training.lora import inference_weights
from ludic.training.parallel.runtime import run_on_main
from ludic.training.parallel.state import (
    fit_state_to_model,
    indexed_optimizer_state,
    named_optimizer_state,
    optimizer_param_names,
)

T = TypeVar("T")

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
_INTERRUPTS = (KeyboardInterrupt, asyncio.CancelledError)
"""What `close()` skips its barrier for: a peer may be inside the step's collectives."""

logger = logging.getLogger(__name__)


def init_process_group_from_env(
    device: str | torch.device = "cpu", *, timeout_s: float = 1800.0
) -> torch.device:
    """Join torchrun's group (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK from the
    environment) unless already joined; returns this rank's device (`cuda:LOCAL_RANK` for a
    CUDA `device`, else CPU). Backend: NCCL on CUDA, gloo on CPU."""
    cuda = torch.device(device).type == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but CUDA is not available on this rank")
    rank_device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(rank_device)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if cuda else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=rank_device if cuda else None,
        )
    return rank_device


def shard_model(model: torch.nn.Module, *, frozen: bool = False) -> torch.nn.Module:
    """`fully_shard` each transformer block (HF `_no_split_modules`), then the root; gradients
    are reduced as plain sums (gloo has no pre-scaled sum). `frozen=True` is for a model only
    run forward (a reference model): its root reshards after each forward too (FSDP2 keeps the
    root's weights, embeddings and head, gathered for the backward it expects, which a frozen
    model never runs, so they would stay whole on every rank)."""
    block_names: set[str] = set()
    for module in model.modules():
        block_names.update(getattr(module, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in block_names:
            fully_shard(module)
    fully_shard(model, reshard_after_forward=True if frozen else None)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model` is FSDP2-sharded (an `FSDPModule`, or holding DTensor parameters)."""
    return isinstance(model, FSDPModule) or any(isinstance(p, DTensor) for p in model.parameters())


class FSDPRuntime:
    """This rank of a torchrun job: FSDP2-sharded model, states gathered to and broadcast from
    rank 0. Build it with `FSDPRuntime.from_env(device)` (or `auto_runtime`)."""

    def __init__(self, device: torch.device, *, owns_group: bool = False) -> None:
        if not dist.is_initialized():
            raise RuntimeError("FSDPRuntime needs an initialised process group (use from_env)")
        self._device = device
        self._owns_group = owns_group
        self._rank = dist.get_rank()
        self._world_size = dist.get_world_size()

    @classmethod
    def from_env(cls, device: str | torch.device = "cpu") -> FSDPRuntime:
        owns = not dist.is_initialized()
        return cls(init_process_group_from_env(device), owns_group=owns)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_main(self) -> bool:
        return self._rank == 0

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Rank 0's weights on every rank, then sharded."""
        return shard_model(self._from_main(model))

    def prepare_reference_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Rank 0's weights on every rank, sharded with `frozen=True`, in eval mode without
        gradients. A model with FSDP2-sharded (DTensor) parameters is not sharded again: one
        the caller passed through `shard_model`, or one sharing modules with the policy."""
        if not is_sharded(model):
            model = shard_model(self._from_main(model.requires_grad_(False)), frozen=True)
        return model.to(self._device).eval().requires_grad_(False)

    def _from_main(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self._device)
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        return model

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return [float(v) for v in tensor.tolist()]

    def all_reduce_max(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64, device=self._device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def all_ranks(self, flag: bool) -> bool:
        return self.all_reduce_sum([0.0 if flag else 1.0])[0] == 0.0

    def any_rank(self, flag: bool) -> bool:
        return self.all_reduce_sum([1.0 if flag else 0.0])[0] > 0.0

    def all_gather_object(self, obj: T) -> list[T]:
        out: list[Any] = [None] * self._world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: T) -> T:
        box: list[Any] = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[no-any-return]

    def barrier(self) -> None:
        dist.barrier()

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float | None) -> float:
        params = [p for p in model.parameters() if p.grad is not None]
        limit = torch.inf if max_norm is None else max_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=limit)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm.item())

    def full_model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_GATHER))

    def load_model_state(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        fitted: dict[str, torch.Tensor] = {}

        def fit() -> bool:  # on rank 0 only; the tensors go out through DCP's broadcast
            nonlocal fitted
            fitted, partial = fit_state_to_model(model, state)
            return partial

        partial = run_on_main(self, fit, "fitting the loaded state to the model")
        options = StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=not partial
        )
        set_model_state_dict(model, cast(dict[str, Any], fitted), options=options)

    def full_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        named = get_optimizer_state_dict(model, optimizer, options=_GATHER)
        return indexed_optimizer_state(named) if self.is_main else {}

    def load_optimizer_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: Mapping[str, Any] | None,
    ) -> None:
        names = optimizer_param_names(model, optimizer)
        if not self.broadcast_object(state is not None):
            return
        named: dict[str, Any] = {}

        def convert() -> None:  # on rank 0 only
            nonlocal named
            assert state is not None
            named = named_optimizer_state(state, names)

        run_on_main(self, convert, "converting the loaded optimizer state")
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, optimizer, named, options=options)

    def inference_weights(self, model: torch.nn.Module) -> Weights | None:
        state = self.full_model_state(model)
        return inference_weights(model, state) if self.is_main else None

    def close(self) -> None:
        """Destroy the group this runtime created, after a barrier: a rank that tears its gloo
        pairs down while a peer is still mid-collective (or still writing results) can abort the
        peer's transport threads at exit. Closing while a Ctrl-C or SIGTERM propagates (torchrun
        passes one to every rank, landing at another point of the step on each) skips the
        barrier: a peer still inside the step's collectives would never reach it, and both
        would wait until torchrun kills them; leaving the group makes the peer's collective
        fail instead, so it stops on its own interrupt. Under `asyncio.run` (`ludic learner`)
        an interrupt that lands while the loop waits reaches the coroutine's `finally` as
        `CancelledError`, which counts alike. A barrier that fails while an error propagates
        (the peer left) is logged, so that error, not gloo's, is what the caller sees."""
        if not (self._owns_group and dist.is_initialized()):
            return
        propagating = sys.exc_info()[1]
        try:
            if not isinstance(propagating, _INTERRUPTS):
                dist.barrier()
        except Exception as e:
            if propagating is None:
                raise
            logger.warning(
                "rank %d: the closing barrier failed while %s propagates: %s",
                self.rank,
                type(propagating).__name__,
                e,
            )
        finally:
            dist.destroy_process_group()
