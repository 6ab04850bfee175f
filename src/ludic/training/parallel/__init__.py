"""Parallel training: where the training loop runs. The `TrainingRuntime` seam, one process
(`LocalRuntime`) or FSDP2 under torchrun (`FSDPRuntime`), `auto_runtime` choosing between them,
and world-size-independent full training states. (Pushing weights to inference servers is
`ludic.distributed`.)

The FSDP names load on first use (DCP and DTensor take about a second to import)."""

from typing import TYPE_CHECKING, Any

from ludic.training.parallel.auto import auto_runtime, launched_world_size
from ludic.training.parallel.runtime import (
    LocalRuntime,
    RankCheckedSource,
    RankFailedError,
    TrainingRuntime,
    check_batch_together,
    check_reference_model,
    check_same_on_every_rank,
    next_batch_together,
    nonfinite_on_any_rank,
    raise_if_any_failed,
    raise_together,
    run_on_main,
    run_together,
    run_together_async,
)
from ludic.training.parallel.state import (
    fit_state_to_model,
    indexed_optimizer_state,
    named_optimizer_state,
    optimizer_param_names,
)

if TYPE_CHECKING:
    from ludic.training.parallel.fsdp import (
        FSDPRuntime,
        init_process_group_from_env,
        is_sharded,
        shard_model,
    )

_LAZY = ("FSDPRuntime", "init_process_group_from_env", "is_sharded", "shard_model")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from ludic.training.parallel import fsdp

        return getattr(fsdp, name)
    raise AttributeError(f"module 'ludic.training.parallel' has no attribute {name!r}")


__all__ = [
    "FSDPRuntime",
    "LocalRuntime",
    "RankCheckedSource",
    "RankFailedError",
    "TrainingRuntime",
    "auto_runtime",
    "check_batch_together",
    "check_reference_model",
    "check_same_on_every_rank",
    "fit_state_to_model",
    "indexed_optimizer_state",
    "init_process_group_from_env",
    "is_sharded",
    "launched_world_size",
    "named_optimizer_state",
    "next_batch_together",
    "nonfinite_on_any_rank",
    "optimizer_param_names",
    "raise_if_any_failed",
    "raise_together",
    "run_on_main",
    "run_together",
    "run_together_async",
    "shard_model",
]
