"""Model weights on disk: read a state dict from any of the four Hugging Face layouts, load it
into a module (tied weights allowed to be absent), and write one.

Formats read: single `model.safetensors`, sharded `model.safetensors.index.json`, single
`pytorch_model.bin` / `pytorch_model.pt`, sharded `pytorch_model.bin.index.json`, and a peft
adapter's `adapter_model.safetensors` (adapter weights under peft's key names). Torch files are
read with `weights_only=True` (no arbitrary unpickling). No hub downloads, no format conversion.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import safetensors.torch
import torch

from ludic.errors import Refusal

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
TORCH_INDEX = "pytorch_model.bin.index.json"
TORCH_SINGLE = ("pytorch_model.bin", "pytorch_model.pt")
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class CorruptCheckpointError(Refusal, RuntimeError):
    """A checkpoint or weights directory that is incomplete or damaged."""


def _read_torch_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CorruptCheckpointError(f"{path}: cannot read torch weights ({e})") from e
    if not isinstance(state, Mapping):
        raise CorruptCheckpointError(f"{path}: expected a state dict, found {type(state).__name__}")
    return dict(state)


def _read_safetensors_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load_file(str(path), device="cpu")
    except Exception as e:
        raise CorruptCheckpointError(f"{path}: cannot read safetensors weights ({e})") from e


def _read_index(directory: Path, index_name: str, single: bool) -> dict[str, torch.Tensor]:
    index_path = directory / index_name
    try:
        weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError) as e:
        raise CorruptCheckpointError(f"{index_path}: not a valid shard index ({e})") from e
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = directory / shard
        if not shard_path.is_file():
            raise CorruptCheckpointError(
                f"{index_path} lists shard {shard}, which is missing from {directory}"
            )
        reader = _read_safetensors_file if single else _read_torch_file
        state.update(reader(shard_path))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise CorruptCheckpointError(
            f"{index_path} maps {len(missing)} tensors that no shard contains, e.g. {missing[:3]}"
        )
    return state


def read_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """The full state dict stored in `directory` (CPU tensors), from whichever supported layout
    it holds (checked in the order: safetensors index, safetensors, torch index, torch, peft
    adapter)."""
    path = Path(directory)
    if (path / SAFETENSORS_INDEX).is_file():
        return _read_index(path, SAFETENSORS_INDEX, single=True)
    if (path / SAFETENSORS_SINGLE).is_file():
        return _read_safetensors_file(path / SAFETENSORS_SINGLE)
    if (path / TORCH_INDEX).is_file():
        return _read_index(path, TORCH_INDEX, single=False)
    for name in TORCH_SINGLE:
        if (path / name).is_file():
            return _read_torch_file(path / name)
    if (path / ADAPTER_SAFETENSORS).is_file():
        return _read_safetensors_file(path / ADAPTER_SAFETENSORS)
    raise FileNotFoundError(
        f"no model weights in {path}: expected one of {SAFETENSORS_INDEX}, {SAFETENSORS_SINGLE}, "
        f"{TORCH_INDEX}, {', '.join(TORCH_SINGLE)}, {ADAPTER_SAFETENSORS}"
    )


def load_weights(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy `state_dict` into `model`. A missing key is allowed only for a parameter tied to
    (the same tensor as) one that is present, as HF omits tied lm_head weights."""
    result = model.load_state_dict(dict(state_dict), strict=False)
    if result.unexpected_keys:
        raise ValueError(
            f"the weights do not fit the model: unexpected keys {result.unexpected_keys[:5]}"
        )
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ptrs = {params[k].data_ptr() for k in state_dict if k in params}
    untied = [
        k
        for k in result.missing_keys
        if params.get(k) is None or params[k].data_ptr() not in loaded_ptrs
    ]
    if untied:
        raise ValueError(f"the weights do not fit the model: missing keys {untied[:5]}")


def save_weights(
    model: torch.nn.Module,
    directory: str | Path,
    *,
    max_shard_size: int | str = "5GB",
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Write `model` to `directory`: HF `save_pretrained` (safetensors, sharded with an index
    above `max_shard_size`; a peft model writes its adapter, naming its base model by an
    absolute path when that is a local folder) when it has it, else one `model.safetensors`.
    `state_dict` replaces the model's own tensors (e.g. a sharded model's full state gathered on
    rank 0)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    save_pretrained = getattr(model, "save_pretrained", None)
    if callable(save_pretrained):
        if state_dict is None and not hasattr(model, "peft_config"):  # peft: its adapter
            state_dict = model.state_dict()
        extra = {} if state_dict is None else {"state_dict": _on_host(state_dict)}
        with _no_hf_progress_bar():  # one "Writing model shards" bar per checkpoint is noise
            save_pretrained(str(path), max_shard_size=max_shard_size, **extra)
        _absolute_adapter_base(path)
        return
    if state_dict is None:
        state_dict = model.state_dict()
    # copies: safetensors refuses tensors that share memory (tied weights, and every
    # parameter once `TrainerConfig.contiguous_parameters` laid them out in one storage)
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state_dict.items()}
    safetensors.torch.save_file(tensors, str(path / SAFETENSORS_SINGLE))


def _absolute_adapter_base(directory: Path) -> None:
    """Rewrite a peft adapter's `base_model_name_or_path` as an absolute path when it names a
    local folder relative to this process's working directory: loading the adapter from another
    directory would otherwise miss its base, or find another folder of that name. Hub names
    (no such local folder) are left as they are."""
    config_file = directory / ADAPTER_CONFIG
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base or not Path(base).expanduser().is_dir():
        return
    absolute = str(Path(base).expanduser().resolve())
    if absolute != base:
        config["base_model_name_or_path"] = absolute
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _on_host(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with its accelerator tensors copied to the CPU one by one. transformers
    clones tensors that share a storage before writing them (`remove_tied_weights_from_state_dict`):
    on a GPU, with the parameters laid out in one storage, that was a second copy of the model
    in GPU memory at every checkpoint; host copies share nothing and are what gets written."""
    return {k: v.detach().to("cpu") if v.device.type != "cpu" else v for k, v in state_dict.items()}


@contextmanager
def _no_hf_progress_bar() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
