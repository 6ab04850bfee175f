"""LoRA through peft: wrap a causal LM with adapters, map peft's adapter checkpoint keys to the
live model's, fold adapters into full base-model weights for inference, and run the model as
its base (adapters disabled) for a KL reference without a second copy.

Merging is a pure function of a full state dict (`W = W0 + scaling * B @ A`), so it works the
same on a sharded model's gathered state and never touches the live model. Only plain LoRA on
Linear layers with one adapter is handled (no DoRA, no `modules_to_save`, no trained biases);
peft is imported only when a LoRA model is built or merged.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

ADAPTER = "default"
"""The adapter name peft gives the only adapter (it is left out of saved adapter keys)."""
PEFT_PREFIX = "base_model.model."
_LORA_PARTS = (".lora_A.", ".lora_B.")
# what transformers 5 warns when peft's get_peft_model reads the old property name (peft's
# code, not the user's: nothing they could change)
_PEFT_DEPRECATION = r"`is_gradient_checkpointing` is deprecated"


def add_lora(
    model: torch.nn.Module,
    *,
    rank: int = 8,
    alpha: int = 16,
    dropout: float = 0.0,
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    seed: int = 0,
) -> torch.nn.Module:
    """`model` wrapped by peft with LoRA adapters (B starts at zero, so outputs are unchanged);
    only the adapters require gradients. Needs `pip install peft` (the `peft` extra). TypeError
    for anything but a plain (not yet LoRA) module, e.g. `load_model`'s (model, tokenizer).

    The random A matrices are drawn from `seed`, leaving torch's RNG as it was: they are made
    before the Trainer seeds anything, from an RNG torch seeds at random in each process, so
    without it two runs of one seeded program trained different adapters. The default 0 draws
    the same adapters in every run whatever else it seeds: pass your run's seed (the one given
    to `TrainerConfig(seed=...)`) so that runs with other seeds start from other adapters."""
    _check_lora_base(model)
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("LoRA needs peft: pip install 'ludic[peft]'") from e
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    # fork only the RNGs of the devices the model is on: fork_rng() without devices reads (and
    # so opens a CUDA context on) every visible GPU, in every torchrun rank
    gpus = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=gpus), peft_deprecation_silenced():
        # seed only the RNGs forked here: torch.manual_seed also reseeds every other GPU's,
        # which fork_rng does not restore
        torch.default_generator.manual_seed(seed)
        for gpu in gpus:
            torch.cuda.default_generators[gpu].manual_seed(seed)
        return get_peft_model(model, config)  # type: ignore[arg-type]


@contextmanager
def peft_deprecation_silenced() -> Iterator[None]:
    """Inside: transformers' FutureWarning about `is_gradient_checkpointing`, which peft's model
    wrappers (get_peft_model, PeftModel.from_pretrained) trigger, is not shown; nothing else is
    filtered, and only inside."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PEFT_DEPRECATION, category=FutureWarning)
        yield


def _check_lora_base(model: object) -> None:
    if isinstance(model, tuple):
        kinds = ", ".join(type(part).__name__ for part in model)
        raise TypeError(
            f"add_lora takes the model, got a tuple ({kinds}): load_model and build_tiny_model "
            "return (model, tokenizer); unpack it first: "
            "`model, tokenizer = load_model(DIR); model = add_lora(model)`"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"add_lora takes a torch.nn.Module (a causal LM), got {type(model).__name__}"
        )
    if is_lora_model(model):
        raise TypeError(
            "add_lora: this model already has LoRA adapters (a peft model); call add_lora once, "
            "on the base model"
        )


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` to serve: a LoRA model becomes its base model with the adapters folded
    in (`merge_and_unload`), under the base model's parameter names, which are the names the
    Trainer publishes (`inference_weights`); any other model is deep-copied as it is. The live
    model is not touched."""
    import copy

    served = copy.deepcopy(model)
    if not is_lora_model(served):
        return served
    return served.merge_and_unload()  # type: ignore[operator]


def is_lora_model(model: torch.nn.Module) -> bool:
    """A peft model (it carries `peft_config`), sharded or not."""
    return hasattr(model, "peft_config")


def is_own_base(model: torch.nn.Module, ref_model: torch.nn.Module) -> bool:
    """Whether `ref_model` is the base model LoRA `model` was built in (`model.get_base_model()`:
    peft adds the adapters into it in place, so it runs with them). As a KL reference it means
    the base's own weights: `model` run under `adapters_disabled`, with no copy."""
    if not is_lora_model(model):
        return False
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model is not None and ref_model is get_base_model()


@contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """LoRA `model` as its base model, in eval mode (no dropout, as a reference copy runs),
    for the duration; its adapters and mode are back afterwards."""
    training = model.training
    model.eval()
    try:
        with model.disable_adapter():  # type: ignore[operator]
            yield model
    finally:
        model.train(training)


def lora_scalings(model: torch.nn.Module) -> dict[str, float]:
    """Name of each LoRA-wrapped layer -> its scaling (alpha / rank). Raises ValueError for an
    adapter this module cannot merge by hand."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    scalings: dict[str, float] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, LoraLinear) or module.fan_in_fan_out:
            raise ValueError(f"{name}: only LoRA on Linear layers can be merged, got {module}")
        if set(module.lora_A) != {ADAPTER} or module.use_dora.get(ADAPTER, False):
            raise ValueError(f"{name}: expected one plain LoRA adapter named {ADAPTER!r}")
        scalings[name] = float(module.scaling[ADAPTER])
    return scalings


def merge_lora_weights(
    state: Mapping[str, torch.Tensor], scalings: Mapping[str, float]
) -> dict[str, torch.Tensor]:
    """Base-model weights (names without peft's prefixes) with each adapter folded in:
    `W = W0 + scaling * (B @ A)` in W0's dtype, as `merge_and_unload` computes it."""
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if not any(part in key for part in _LORA_PARTS):
            merged[_base_name(key)] = tensor
    for layer, scaling in scalings.items():
        a = state[f"{layer}.lora_A.{ADAPTER}.weight"]
        b = state[f"{layer}.lora_B.{ADAPTER}.weight"]
        name = _base_name(f"{layer}.base_layer.weight")
        base = merged[name]
        merged[name] = base + (b.to(base.dtype) @ a.to(base.dtype)) * scaling
    return merged


def inference_weights(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The weights inference serves: `state` itself, or merged when `model` is a LoRA model."""
    if is_lora_model(model):
        return merge_lora_weights(state, lora_scalings(model))
    return dict(state)


def adapter_keys_to_model(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's saved adapter keys (`...q_proj.lora_A.weight`) under the live model's names
    (`...q_proj.lora_A.default.weight`); keys already carrying the adapter name are kept."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        for part in _LORA_PARTS:
            if part in key and f"{part}{ADAPTER}." not in key:
                key = key.replace(part, f"{part}{ADAPTER}.", 1)
        out[key] = tensor
    return out


def _base_name(key: str) -> str:
    return key.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
