"""`torch.compile` of a causal LM's pointwise-heavy modules for training (`TrainerConfig.compile`).

`compile_for_training(model)` compiles, in place and with dynamic shapes, every module whose
class is an MLP or an RMSNorm (`LlamaMLP`, `LlamaRMSNorm`, `Qwen2MLP`, ...): Inductor fuses the
elementwise work around their GEMMs (the norm's square, mean, rsqrt and scale; SiLU(gate) x up)
in forward and backward, the GEMMs stay the same library calls. In place (each module's
`_compiled_call_impl`, as `nn.Module.compile` does) keeps parameter names, `state_dict`,
checkpoints and weight publishing unchanged.

Few graphs, whatever a run does. Dynamo keeps at most `torch._dynamo.config.recompile_limit`
(8) graphs per forward function and runs eager past it, so the modes a run mixes must not each
cost a graph:

- lengths: every size but the hidden one is dynamic, and the leading (row, token) sizes are
  marked unbacked, so a one-row micro-batch or the shared-prefix path's one-row prompt call
  runs the same graph as 8 rows (Dynamo would otherwise specialise sizes 0 and 1);
- grad mode: only calls with grad enabled run compiled. Under `torch.no_grad` or
  `torch.inference_mode` (the publisher's logprob probe, an evaluation) the module runs
  eager: nothing new compiles, results are eager's;
- one graph per compile call: all the MLPs share one graph and all the norms another,
  whatever the depth, in a recompile region of their own (`isolate_recompiles`): other
  `torch.compile` calls on the same classes neither use up this model's limit nor it theirs.

A training run so compiles one graph per kind, input rank and autocast setting: 2 in float32
(Llama, Mistral, Qwen2; Qwen3's per-head q/k norms add one 4-D norm graph), as many more if the
same process also trains under bf16 autocast. Anything else that changes a guard (an input's
dtype or requires_grad) still costs a graph; should a kind reach the limit anyway, the call is
run eager and a `CompileFallbackWarning` (once per kind) names the module, the call's mode and
the fix, instead of Dynamo silently dropping the speedup.

Why not whole decoder layers: Hugging Face attention indexes the KV cache by the layer's
`layer_idx`, which Dynamo specialises on, so with a cache (the shared-prefix path) every layer
compiles its own graphs and a model deeper than 4 layers hits Dynamo's recompile limit
(eager from there on). `bench/train_step.py --arms base,compile_layers` measures that variant.

What it does not do: compile attention, the embedding, the LM head or the logprob/loss head,
forwards without grad, or anything under data-parallel training (the Trainer refuses `compile`
with FSDP2). Results equal the eager ones within float rounding, not bit for bit (fused kernels
round in another order). The first forward and backward pay the compile (seconds to tens of
seconds, cached on disk by Inductor for the next run). Hooks registered on a compiled module
still run (its whole `_call_impl` is compiled); a deep copy or pickle of the model is eager
(`nn.Module` drops `_compiled_call_impl`).
"""

from __future__ import annotations

import inspect
import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo.exc
from torch._dynamo.decorators import mark_unbacked

__all__ = [
    "COMPILED_KINDS",
    "CompileFallbackWarning",
    "compile_for_training",
    "compile_trainer_model",
    "compiled_regions",
]

logger = logging.getLogger(__name__)

COMPILED_KINDS = ("MLP", "RMSNorm")
"""Suffixes of the class names `compile_for_training` compiles."""

# torch 2.7 renamed Dynamo's cache-size names (the old config names stay as aliases)
_LIMIT_NAME = next(
    n for n in ("recompile_limit", "cache_size_limit") if hasattr(torch._dynamo.config, n)
)
_FAIL_FLAG = next(
    (
        n
        for n in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit")
        if hasattr(torch._dynamo.config, n)
    ),
    None,  # torch < 2.6: no way to catch the limit, Dynamo's own warning is all there is
)
_LimitHit: type[Exception] = getattr(
    torch._dynamo.exc,
    "FailOnRecompileLimitHit",
    getattr(torch._dynamo.exc, "FailOnCacheLimitHit", Exception),
)
_ISOLATE: dict[str, Any] = (
    {"isolate_recompiles": True}  # recent torch (2.13 has it)
    if "isolate_recompiles" in inspect.signature(torch.compile).parameters
    else {}
)


class CompileFallbackWarning(RuntimeWarning):
    """A compiled module needed more graphs than Dynamo's recompile limit allows: the calls no
    compiled graph fits run eager, without the compile's speedup."""


def compiled_regions(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, module) of every module `compile_for_training` would compile: those
    whose class name ends with one of `COMPILED_KINDS`, outermost only (a norm inside an MLP
    is compiled as part of it)."""
    regions: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer, _ in regions)
        if type(module).__name__.endswith(COMPILED_KINDS) and not inside:
            regions.append((name, module))
    return regions


@dataclass(slots=True)
class _KindState:
    """Shared by the modules of one class in one compile call (they share Dynamo's graphs)."""

    fell_back: bool = False


class _CompiledCall:
    """A compiled module's `_compiled_call_impl`: the shared compiled `_call_impl` with grad,
    eager without; warns once per kind when Dynamo's recompile limit sends a call to eager."""

    __slots__ = ("compiled", "module", "name", "state")

    def __init__(
        self, module: torch.nn.Module, name: str, compiled: Any, state: _KindState
    ) -> None:
        self.module, self.name, self.compiled, self.state = module, name, compiled, state

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.module._call_impl(*args, **kwargs)
        _mark_rows_unbacked(args)
        if self.state.fell_back or _FAIL_FLAG is None:  # Dynamo: the graphs that fit, or eager
            return self.compiled(self.module, *args, **kwargs)
        config = torch._dynamo.config
        saved = getattr(config, _FAIL_FLAG)
        setattr(config, _FAIL_FLAG, True)  # raise instead of going eager in silence
        try:
            return self.compiled(self.module, *args, **kwargs)
        except _LimitHit:
            self.state.fell_back = True
            message = _fallback_message(self.name, self.module, args)
            warnings.warn(message, CompileFallbackWarning, stacklevel=2)
            return self.module._call_impl(*args, **kwargs)
        finally:
            setattr(config, _FAIL_FLAG, saved)


def _mark_rows_unbacked(args: tuple[Any, ...]) -> None:
    """Mark every size but the last (hidden) one of the tensor arguments unbacked: one graph
    for any number of rows and tokens, 1 included. A view's base too: Dynamo guards a view's
    sizes through its base (Qwen3's q/k norms get `q_proj(x).view(...)`), so an unmarked base
    still recompiled for 1-row and 1-token calls (5 graphs of Qwen3RMSNorm in float32)."""
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.dim() > 1:
            _mark_unbacked_but_last(arg)
            if isinstance(arg._base, torch.Tensor) and arg._base.dim() > 1:
                _mark_unbacked_but_last(arg._base)


def _mark_unbacked_but_last(tensor: torch.Tensor) -> None:
    marked = getattr(tensor, "_dynamo_unbacked_indices", ())
    for dim in range(tensor.dim() - 1):
        if dim not in marked:
            mark_unbacked(tensor, dim)


def _fallback_message(name: str, module: torch.nn.Module, args: tuple[Any, ...]) -> str:
    kind = type(module).__name__
    limit = getattr(torch._dynamo.config, _LIMIT_NAME)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    inputs = ", ".join(
        f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)} requires_grad={t.requires_grad}"
        for t in tensors
    )
    device = tensors[0].device.type if tensors else "cpu"
    autocast = (
        str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        if torch.is_autocast_enabled(device)
        else "off"
    )
    return (
        f"TrainerConfig.compile: {name} ({kind}) hit Dynamo's recompile limit "
        f"(torch._dynamo.config.{_LIMIT_NAME} = {limit} graphs of {kind}.forward): this call "
        f"(autocast {autocast}, input {inputs}) and every later {kind} call no compiled graph "
        "fits run eager, without the compile's speedup. Each autocast dtype, input dtype and "
        "requires_grad a process trains with costs a graph: keep one setting per process, or "
        f"raise torch._dynamo.config.{_LIMIT_NAME} before the first step "
        '(TORCH_LOGS="recompiles" prints each recompile\'s cause)'
    )


def compile_for_training(model: torch.nn.Module) -> list[str]:
    """Compile every MLP and RMSNorm of `model` in place (dynamic shapes, see the module
    docstring); returns their names. Compilation itself happens at the first forward with grad.
    Modules this already compiled are left as they are (calling it twice adds no graphs).
    Raises ValueError naming the model when it has none (nothing would be compiled)."""
    regions = compiled_regions(model)
    if not regions:
        raise ValueError(
            f"TrainerConfig.compile: {type(model).__name__} has no module whose class name "
            f"ends with one of {COMPILED_KINDS}; nothing to compile, turn compile off"
        )
    compiled = torch.compile(torch.nn.Module._call_impl, dynamic=True, **_ISOLATE)
    states: dict[type, _KindState] = {}
    for name, module in regions:
        if not isinstance(module._compiled_call_impl, _CompiledCall):
            state = states.setdefault(type(module), _KindState())
            module._compiled_call_impl = _CompiledCall(module, name, compiled, state)
    return [name for name, _ in regions]


def compile_trainer_model(model: torch.nn.Module, *, world_size: int = 1) -> list[str]:
    """`TrainerConfig(compile=True)`: `compile_for_training` in a single process; under
    data-parallel training (FSDP2, `world_size > 1`) a ValueError saying so."""
    if world_size > 1:
        raise ValueError(
            f"TrainerConfig.compile is single-process only (this run has {world_size} ranks "
            "under FSDP2, whose per-module hooks it is not tested with); set compile=False"
        )
    names = compile_for_training(model)
    logger.info("compiled %d modules for training (first step compiles)", len(names))
    return names
