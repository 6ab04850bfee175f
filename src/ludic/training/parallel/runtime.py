"""Where the training loop runs: the `TrainingRuntime` seam and its single-process version.

The Trainer asks its runtime to place the model, agree on counts and decisions across ranks,
clip gradients and move full (unsharded) model and optimizer states in and out. It never
branches on which runtime it has: in one process every agreement is the identity. FSDP2 lives
in `fsdp.py`; `auto.auto_runtime` picks it under torchrun. Nothing here launches processes.

What one rank alone does inside a step (its publisher's push, writing a checkpoint, its logger,
its share of an eval) runs through `run_on_main` / `run_together`, its batch fetch through
`next_batch_together` (and a source's cross-rank check of it through `check_batch_together`),
and its own work before an all-reduce the step makes anyway reports there
(`raise_if_any_failed`): when it raises on one rank, every rank raises (`RankFailedError`
on the others, naming the rank and the cause) instead of going on alone into the next
collective and waiting there until the process group times out.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from ludic._aio import maybe_await
from ludic.distributed.interfaces import Weights
from ludic.training.batching.types import BatchSourceExhausted, wrapped_sources
from ludic.training.lora import inference_weights, is_lora_model, is_own_base
from ludic.training.parallel.state import fit_state_to_model

T = TypeVar("T")


class TrainingRuntime(Protocol):
    """One process of a data-parallel job (or the only one). Every method is called by every
    rank in the same order; methods that return a full state return it on the main rank (rank
    0, which writes checkpoints and publishes) and an empty one elsewhere."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def is_main(self) -> bool: ...

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move to the device (and shard); build the optimizer from the returned model."""
        ...

    def prepare_reference_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """A model only run forward (a KL reference): on the device, in eval mode, without
        gradients (and sharded like the policy, frozen, unless it already is)."""
        ...

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]: ...

    def all_reduce_max(self, value: int) -> int: ...

    def all_ranks(self, flag: bool) -> bool:
        """True when `flag` is true on every rank."""
        ...

    def any_rank(self, flag: bool) -> bool: ...

    def all_gather_object(self, obj: T) -> list[T]: ...

    def broadcast_object(self, obj: T) -> T:
        """The main rank's `obj`, on every rank."""
        ...

    def barrier(self) -> None: ...

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float | None) -> float:
        """Clip the global gradient norm (inf: no clipping); returns the norm before clipping."""
        ...

    def full_model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]: ...

    def load_model_state(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        """Load a full state read on the main rank (ignored elsewhere); the dict is not changed."""
        ...

    def full_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """The state in the single-process `optimizer.state_dict()` layout (params by index)."""
        ...

    def load_optimizer_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: Mapping[str, Any] | None,
    ) -> None: ...

    def inference_weights(self, model: torch.nn.Module) -> Weights | None:
        """What a publisher should push (LoRA merged in); None off the main rank."""
        ...

    def close(self) -> None: ...


class LocalRuntime:
    """A single process on `device`: agreements are the identity, states are the module's."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self._device = torch.device(device)
        if self._device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"device={str(device)!r} but CUDA is not available in this process (torch "
                f"{torch.__version__}): train with device='cpu' (TrainerConfig(device='cpu')), "
                "or install a CUDA build of torch on a machine with a GPU"
            )

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_main(self) -> bool:
        return True

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self._device)

    def prepare_reference_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self._device).eval().requires_grad_(False)

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def all_reduce_max(self, value: int) -> int:
        return value

    def all_ranks(self, flag: bool) -> bool:
        return flag

    def any_rank(self, flag: bool) -> bool:
        return flag

    def all_gather_object(self, obj: T) -> list[T]:
        return [obj]

    def broadcast_object(self, obj: T) -> T:
        return obj

    def barrier(self) -> None:
        return None

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float | None) -> float:
        params = [p for p in model.parameters() if p.grad is not None]
        limit = torch.inf if max_norm is None else max_norm
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm=limit).item())

    def full_model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return dict(model.state_dict())

    def load_model_state(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        fitted, partial = fit_state_to_model(model, state)
        model.load_state_dict(fitted, strict=not partial)

    def full_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: Mapping[str, Any] | None,
    ) -> None:
        if state is not None:
            optimizer.load_state_dict(dict(state))

    def inference_weights(self, model: torch.nn.Module) -> Weights | None:
        if is_lora_model(model):
            return inference_weights(model, model.state_dict())
        return model

    def close(self) -> None:
        return None


def check_reference_model(model: torch.nn.Module, ref_model: torch.nn.Module) -> None:
    """Refuse a reference model that shares parameters with the policy (the model itself, or
    a model holding some of its modules): freezing the reference would freeze the policy, and
    the KL would compare the policy with itself. A LoRA policy's own base is not refused: the
    Trainer runs the policy with its adapters disabled for it (`lora.is_own_base`)."""
    if is_own_base(model, ref_model):
        return
    policy = {id(p) for p in model.parameters()}
    shared = sum(id(p) in policy for p in ref_model.parameters())
    if shared:
        raise ValueError(
            f"ref_model shares {shared} parameters with the model being trained (it is the "
            "model, or a model holding some of its modules): the Trainer would freeze them and "
            "the KL term would compare the policy with itself; pass a separate copy made "
            "before training, e.g. ref_model=copy.deepcopy(base_model), or for a LoRA model "
            "its own base, ref_model=model.get_base_model() (the model with its adapters "
            "disabled, no copy)"
        )


def nonfinite_on_any_rank(runtime: TrainingRuntime, model: torch.nn.Module) -> list[str]:
    """The names of `model`'s floating tensors holding a nan or an inf on any rank (sorted; []
    when every rank's are finite). Each rank checks only its own local shards, where they live
    (`checksum.nonfinite`: one float sum per tensor), before any gather; the ranks then agree
    (`any_rank`) and, only if one found any, gather the names, so every rank returns the same
    list and can raise the same error (none is left waiting in a collective). Every rank must
    call it. In one process: no collectives, the model's own tensors."""
    from ludic.distributed.checksum import nonfinite

    local = {}
    for name, tensor in model.state_dict().items():
        to_local = getattr(tensor, "to_local", None)  # a DTensor shard (FSDP2): this rank's part
        local[name] = to_local() if callable(to_local) else tensor
    found = nonfinite(local)
    if not runtime.any_rank(bool(found)):
        return []
    return sorted({name for names in runtime.all_gather_object(found) for name in names})


class RankFailedError(RuntimeError):
    """Raised on every other rank when one rank's part of a step failed (its batch source, its
    loss, its publish, the checkpoint it writes, its logger, its share of `eval_fn`): this rank
    stops with it instead of waiting for it in the next collective. The failed rank raises
    its own error (type kept); this one names it (`failed_rank`, `doing`, `cause`:
    "ErrorType: message")."""

    def __init__(self, *, rank: int, failed_rank: int, doing: str, cause: str) -> None:
        self.rank, self.failed_rank, self.doing, self.cause = rank, failed_rank, doing, cause
        super().__init__(
            f"rank {failed_rank} failed while {doing}: {cause}; rank {rank} stops with it "
            f"(rank {failed_rank}'s output has the traceback)"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only arguments: pickled by name
        rebuild = functools.partial(
            RankFailedError,
            rank=self.rank,
            failed_rank=self.failed_rank,
            doing=self.doing,
            cause=self.cause,
        )
        return (rebuild, ())


def _cause(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def raise_together(runtime: TrainingRuntime, error: Exception | None, doing: str) -> None:
    """Every rank calls this after its own part of `doing` (`error`: what that part raised,
    or None). If any rank failed, every rank raises: a failed rank its own `error` (type and
    traceback kept), the others a `RankFailedError` naming the first failed rank and its
    cause. One all-reduce of one number when all went well (the causes are gathered only
    after a failure); in one process, none: `error` is raised as it is."""
    if runtime.world_size == 1:
        if error is not None:
            raise error
        return
    raise_if_any_failed(runtime, error, runtime.any_rank(error is not None), doing)


def raise_if_any_failed(
    runtime: TrainingRuntime, error: Exception | None, any_failed: bool, doing: str
) -> None:
    """`raise_together` for a step that already agreed whether any rank failed (`any_failed`,
    e.g. a failure count carried in an all-reduce the step makes anyway): when one did, every
    rank gathers the causes (its only collective) and raises, this rank its own `error`, the
    others a `RankFailedError` naming the first failed rank. Every rank must call it."""
    if not any_failed:
        return
    if runtime.world_size == 1:
        assert error is not None, "any_failed in one process without an error"
        raise error
    causes = runtime.all_gather_object(None if error is None else _cause(error))
    if error is not None:
        raise error
    failed = next(rank for rank, cause in enumerate(causes) if cause is not None)
    raise RankFailedError(
        rank=runtime.rank, failed_rank=failed, doing=doing, cause=str(causes[failed])
    )


def run_together(runtime: TrainingRuntime, fn: Callable[[], T], doing: str) -> T:
    """`fn()` on every rank (each its own part of `doing`, e.g. a publish only the rank
    holding the publisher does), then `raise_together`: if it raised on any rank, every rank
    raises, so none goes on alone into the next collective. Returns this rank's result."""
    try:
        result = fn()
    except Exception as e:
        raise_together(runtime, e, doing)
        raise  # unreachable: raise_together re-raised `e`
    raise_together(runtime, None, doing)
    return result


async def run_together_async(
    runtime: TrainingRuntime, fn: Callable[[], T | Awaitable[T]], doing: str
) -> T:
    """`run_together` for a function that may return an awaitable (an async `eval_fn`)."""
    try:
        result = await maybe_await(fn())
    except Exception as e:
        raise_together(runtime, e, doing)
        raise  # unreachable: raise_together re-raised `e`
    raise_together(runtime, None, doing)
    return result


def run_on_main(
    runtime: TrainingRuntime, fn: Callable[[], T], doing: str = "running its part alone"
) -> T:
    """Run `fn` on the main rank and hand its result to every rank; if it raises there, every
    rank raises (rank 0 its own error; the others a `RankFailedError` naming rank 0, `doing`
    and the cause), so no rank is left waiting in a collective. One broadcast."""
    result: tuple[bool, Any] = (True, None)
    error: BaseException | None = None
    if runtime.is_main:
        try:
            result = (True, fn())
        except Exception as e:
            error, result = e, (False, _cause(e))
    ok, value = runtime.broadcast_object(result)
    if error is not None:
        raise error
    if not ok:
        raise RankFailedError(rank=runtime.rank, failed_rank=0, doing=doing, cause=str(value))
    return value  # type: ignore[no-any-return]


_FETCHED, _EXHAUSTED, _FAILED = 0, 1, 2


async def next_batch_together(
    runtime: TrainingRuntime,
    fetch: Callable[[], Awaitable[T]],
    doing: str = "fetching the next batch",
) -> T:
    """`await fetch()` (a batch source's next batch); with several ranks, every rank stops when
    any rank's `fetch` raises (one all-reduce per call): when a rank's source failed (e.g. its
    Redis went away, its credit assigner raised) it raises its own error and the others a
    `RankFailedError` naming it, `doing` and the cause; otherwise, when a rank's data ran
    out, every rank raises `BatchSourceExhausted`. None waits alone in the step's collectives."""
    if runtime.world_size == 1:
        return await fetch()
    status = _FETCHED
    error: Exception | None = None  # what this rank's fetch raised, re-raised as it is
    try:
        batch = await fetch()
    except BatchSourceExhausted as exhausted:
        status, error = _EXHAUSTED, exhausted
    except Exception as e:
        status, error = _FAILED, e
    worst = runtime.all_reduce_max(status)
    raise_if_any_failed(runtime, error if status == _FAILED else None, worst == _FAILED, doing)
    if error is not None:
        raise error
    if worst == _EXHAUSTED:
        raise BatchSourceExhausted(
            f"rank {runtime.rank} stops with the others: another rank's batch source is exhausted"
        )
    return batch


@runtime_checkable
class RankCheckedSource(Protocol):
    """A batch source whose ranks must agree on what they read before a step trains on it
    (the pipeline learner's: actors whose credit settings differ, their samples read by
    different ranks). Optional: the Trainer calls `check_ranks` when a source has it."""

    def check_ranks(self, all_gather: Callable[[Any], list[Any]]) -> None:
        """Called on every rank together after each batch is fetched, before the step trains
        on it. `all_gather(obj)` is the ranks' all-gather of a picklable object (every rank's,
        in rank order; `[obj]` in one process): call it exactly once on every rank, whatever
        this rank found, and raise only after it (every rank then stops, none trains)."""
        ...


def check_batch_together(runtime: TrainingRuntime, source: object, doing: str) -> None:
    """`check_ranks` of `source` or of the first source it wraps that has one (a wrapper keeps
    what it wraps as `.source`, as `log_samples` does; none: nothing) through `run_together`:
    when it raises on any rank, every rank raises before the optimizer step, that rank its own
    error and the others a `RankFailedError` naming it."""
    checked = _rank_checked(source)
    if checked is not None:
        run_together(runtime, lambda: checked.check_ranks(runtime.all_gather_object), doing)


def _rank_checked(source: object) -> RankCheckedSource | None:
    """`source`, or the first source it wraps (through `.source`), that has `check_ranks`."""
    found = (s for s in wrapped_sources(source) if isinstance(s, RankCheckedSource))
    return next(found, None)


_WHY_EVERY_RANK = {
    "checkpoint_manager": "rank 0 alone writes checkpoints, but all ranks gather what it writes",
    "eval_fn": "it runs on every rank, so a forward of the sharded model has every rank in it; "
    "an eval that should run once can return {} where trainer.runtime.is_main is False",
    "ref_model": "every rank shards it and runs its forward on each pass",
}


def check_same_on_every_rank(runtime: TrainingRuntime, **given: bool) -> None:
    """Raise on every rank when the ranks differ in any of `given` (whether each rank was
    handed something that makes all ranks meet in collectives, e.g. a checkpoint manager:
    every rank gathers the state rank 0 writes; an `eval_fn` or a reference model, whose
    forwards gather sharded weights). A rank without it would skip the collectives and leave
    the others waiting forever."""
    if runtime.world_size == 1:
        return
    seen = runtime.all_gather_object(given)
    differ = sorted(name for name in given if len({ranks[name] for ranks in seen}) > 1)
    if differ:
        per_rank = [[rank for rank, ranks in enumerate(seen) if ranks[name]] for name in differ]
        detail = "; ".join(f"{n} only on ranks {r}" for n, r in zip(differ, per_rank, strict=True))
        why = "; ".join(
            f"{name}: {_WHY_EVERY_RANK[name]}" for name in differ if name in _WHY_EVERY_RANK
        )
        raise ValueError(
            f"every rank must get the same Trainer arguments ({detail}): give each of "
            f"{', '.join(differ)} to every rank or to none" + (f" ({why})" if why else "")
        )
