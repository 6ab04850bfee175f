"""`torch.compile` of a causal LM's pointwise-heavy modules for training (`TrainerConfig.compile`).

`compile_for_training(model)` compiles, in place and with dynamic shapes, every module whose
class is an MLP or an RMSNorm (`LlamaMLP`, `LlamaRMSNorm`, `Qwen2MLP`, ...): Inductor fuses the
elementwise work around their GEMMs (the norm's square, mean, rsqrt and scale; SiLU(gate) x up)
in forward and backward, the GEMMs stay the same library calls. In place
(`nn.Module.compile`) keeps parameter names, `state_dict`, checkpoints and weight publishing
unchanged. Dynamic shapes let padded batches, packed rows and the shared-prefix path's two
calls of any length run the same kernels: all the MLPs share one compiled graph and all the
norms another, whatever the depth, with no recompile per length.

Why not whole decoder layers: Hugging Face attention indexes the KV cache by the layer's
`layer_idx`, which Dynamo specialises on, so with a cache (the shared-prefix path) every layer
compiles its own graphs and a model deeper than 4 layers hits Dynamo's recompile limit
(eager from there on). `bench/train_step.py --arms base,compile_layers` measures that variant.

What it does not do: compile attention, the embedding, the LM head or the logprob/loss head,
or anything under data-parallel training (the Trainer refuses `compile` with FSDP2). Results
equal the eager ones within float rounding, not bit for bit (fused kernels round in another
order). The first forward and backward pay the compile (seconds to tens of seconds, cached on
disk by Inductor for the next run).
"""

from __future__ import annotations

import logging

import torch

__all__ = ["COMPILED_KINDS", "compile_for_training", "compile_trainer_model", "compiled_regions"]

logger = logging.getLogger(__name__)

COMPILED_KINDS = ("MLP", "RMSNorm")
"""Suffixes of the class names `compile_for_training` compiles."""


def compiled_regions(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, module) of every module `compile_for_training` would compile."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if type(module).__name__.endswith(COMPILED_KINDS)
    ]


def compile_for_training(model: torch.nn.Module) -> list[str]:
    """Compile every MLP and RMSNorm of `model` in place (dynamic shapes); returns their
    names. Compilation itself happens at the first forward. Raises ValueError naming the
    model when it has none (nothing would be compiled)."""
    regions = compiled_regions(model)
    if not regions:
        raise ValueError(
            f"TrainerConfig.compile: {type(model).__name__} has no module whose class name "
            f"ends with one of {COMPILED_KINDS}; nothing to compile, turn compile off"
        )
    for _, module in regions:
        module.compile(dynamic=True)
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
