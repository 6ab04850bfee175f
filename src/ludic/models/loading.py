"""Save and load any local Hugging Face causal LM directory, keeping token ids exactly stable.

transformers 5 may swap a tokenizer's class on reload based on the model type (for example a
Llama config pulls in a Metaspace `LlamaTokenizer`), which silently changes ids. Saving pins the
class to the plain `tokenizer.json` backend, and loading checks the loaded tokenizer against
`tokenizer.json` itself. A checkpoint step folder (`.../checkpoints/step_N`, the path a run
prints as its last checkpoint) loads from its `model/` subfolder; a run folder is refused naming
its latest checkpoint. A LoRA run's checkpoint (a peft adapter directory) loads as its base model
with the adapter merged in. Nothing here downloads from a model hub.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Tokenizer
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

logger = logging.getLogger(__name__)

DTypeLike = torch.dtype | str | None
_PROBE_TEXT = (
    "Hello, world! <think>12 + 30 = 42</think> <move>5</move>\n\n"
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> ünïcödé 日本語'
)
_PLAIN_BACKENDS = ("PreTrainedTokenizerFast", "TokenizersBackend")
ADAPTER_CONFIG = "adapter_config.json"


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str | os.PathLike[str]
) -> Path:
    """Write weights (safetensors), config, generation config and tokenizer to `directory`."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if type(tokenizer).__name__ in _PLAIN_BACKENDS:
        _pin_tokenizer_class(path)
    return path


def _pin_tokenizer_class(path: Path) -> None:
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "TokenizersBackend"
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def resolve_dtype(dtype: DTypeLike) -> torch.dtype | str:
    """`None`/"auto" -> "auto" (the checkpoint's dtype); names like "bfloat16" -> torch dtypes."""
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use e.g. 'float32', 'bfloat16' or 'auto'")
    return resolved


def model_directory(path: str | os.PathLike[str]) -> Path:
    """The model directory `path` names: itself, or the `model/` subfolder of a checkpoint step
    folder (`.../checkpoints/step_N`, which holds `model/` beside the optimizer state)."""
    directory = Path(path).expanduser()
    if not _holds_model(directory) and _holds_model(directory / "model"):
        return directory / "model"
    return directory


def _holds_model(directory: Path) -> bool:
    """A full model (config.json) or a LoRA adapter (adapter_config.json, a LoRA run's
    checkpoint) is saved in `directory`."""
    return (directory / "config.json").is_file() or (directory / ADAPTER_CONFIG).is_file()


def check_model_directory(path: str | os.PathLike[str]) -> Path:
    """The model directory `path` names (as `load_model` reads it), or the FileNotFoundError
    `load_model` would raise, without loading anything: for commands that check their flags
    before slower work (connecting to Redis, building envs)."""
    directory = model_directory(path)
    if not _holds_model(directory):
        raise FileNotFoundError(_not_a_model_directory(Path(path)))
    return directory


def load_model(
    path: str | os.PathLike[str],
    dtype: DTypeLike = None,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local model directory (or a checkpoint step folder: its `model/`) as (model in
    eval mode on `device`, tokenizer)."""
    directory = check_model_directory(path)
    if not (directory / "config.json").is_file():  # a LoRA run's checkpoint: its adapter
        return _load_merged_adapter(directory, dtype, device)
    _check_manifest_sizes(directory)
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=resolve_dtype(dtype))
    except (OSError, SafetensorError) as e:
        raise ValueError(
            f"{directory}: the model's weights are missing or damaged ({e}); copy the folder "
            "again, or load another checkpoint"
        ) from e
    model.to(device)  # type: ignore[arg-type]  # transformers' decorated `to` confuses mypy
    return model.eval(), load_tokenizer(directory)


def _load_merged_adapter(
    directory: Path, dtype: DTypeLike, device: str | torch.device
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model `directory`'s LoRA adapter names (`base_model_name_or_path`, as the run
    saved it: absolute, or relative to the directory the run ran in) with the adapter merged in:
    a plain model, as the LoRA run's policy computes. Tokenizer from the adapter directory."""
    config = json.loads((directory / ADAPTER_CONFIG).read_text())
    base = Path(str(config.get("base_model_name_or_path") or "")).expanduser()
    if not str(base) or not _holds_model(model_directory(base)):
        raise FileNotFoundError(
            f"{directory} holds a LoRA adapter; its base model (base_model_name_or_path in "
            f"{ADAPTER_CONFIG}: {str(base) or 'none'}) is not a model directory from here. Set "
            "it to the base model's folder (the --model the LoRA run started from), or run from "
            "the directory that run ran in"
        )
    from peft import PeftModel  # the LoRA run had peft: its adapter is peft's format

    model, _ = load_model(base, dtype=dtype, device=device)
    merged = PeftModel.from_pretrained(model, str(directory)).merge_and_unload()
    logger.info("loaded %s: LoRA adapter merged into its base model %s", directory, base)
    return merged.eval(), load_tokenizer(directory)


def _check_manifest_sizes(directory: Path) -> None:
    """ValueError naming the first file of a checkpoint's `model/` that its step folder's
    MANIFEST.json lists but that is missing or of another size (a copy in part, a full disk).
    Sizes only: the checkpoint's own verify hashes them when a run resumes."""
    manifest = directory.parent / "MANIFEST.json"
    if directory.name != "model" or not manifest.is_file():
        return
    try:
        files = json.loads(manifest.read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return  # not ours to judge: loading says what is wrong with the weights themselves
    for name, entry in files.items():
        if not name.startswith("model/") or not isinstance(entry, dict):
            continue
        file = directory.parent / name
        size = file.stat().st_size if file.is_file() else None
        if size != entry.get("size"):
            found = "missing" if size is None else f"{size} bytes"
            raise ValueError(
                f"{directory.parent} is damaged or incomplete: {name} is {found}, its "
                f"MANIFEST.json says {entry.get('size')} bytes; copy it again, or load another "
                "checkpoint (e.g. the previous step_N)"
            )


def _not_a_model_directory(path: Path) -> str:
    """Why `path` (which holds no config.json, nor a `model/` that does) is not a model, and
    which path to pass instead."""
    if not path.expanduser().exists():
        return (
            f"no model directory at {path}: check the path (a run saves models under "
            "RUN/checkpoints/step_N/model)"
        )
    latest = _latest_checkpoint_model(path.expanduser())
    if latest is not None:
        return (
            f"{path} holds checkpoints, not one model: pass one of them, e.g. the latest, {latest}"
        )
    return (
        f"{path} is not a model directory (no config.json): pass the folder that holds "
        "config.json and the weights (for a run's checkpoint, .../checkpoints/step_N/model), "
        "or build a tiny one with ludic.models.tiny_model_dir()"
    )


def _latest_checkpoint_model(path: Path) -> Path | None:
    """The `model/` of the highest checkpoint step under a run folder or its `checkpoints/`."""
    for root in (path / "checkpoints", path):
        steps = [p for p in root.glob("step_*") if (p / "model" / "config.json").is_file()]
        if steps:
            return max(steps, key=_step_number) / "model"
    return None


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """AutoTokenizer, replaced by the plain `tokenizer.json` backend if the two disagree on ids
    (`path`: a tokenizer or model directory, or a checkpoint step folder: its `model/`)."""
    directory = Path(path).expanduser()
    if not _has_tokenizer(directory) and (directory / "model").is_dir():
        directory = directory / "model"
    if not _has_tokenizer(directory):
        raise FileNotFoundError(_no_tokenizer(Path(path), directory))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    raw_file = directory / "tokenizer.json"
    if not raw_file.is_file():
        return tokenizer
    expected = Tokenizer.from_file(str(raw_file)).encode(_PROBE_TEXT, add_special_tokens=False).ids
    if tokenizer.encode(_PROBE_TEXT, add_special_tokens=False) == expected:
        return tokenizer
    logger.warning(
        "%s: AutoTokenizer loaded %s whose ids differ from tokenizer.json; using tokenizer.json "
        "as is (set tokenizer_class to TokenizersBackend in tokenizer_config.json to silence this)",
        directory,
        type(tokenizer).__name__,
    )
    return PreTrainedTokenizerFast.from_pretrained(directory)


def _no_tokenizer(path: Path, directory: Path) -> str:
    """Why `directory` (what `path` resolved to) gives no tokenizer, and what to pass."""
    if not directory.exists():
        return f"no tokenizer directory at {path}: check the path"
    latest = _latest_checkpoint_model(directory)
    if latest is not None:
        return f"{path} holds checkpoints, not one tokenizer: pass one of them, e.g. {latest}"
    if (directory / "config.json").is_file():
        return (
            f"{directory} holds no tokenizer (no tokenizer.json or tokenizer_config.json): it "
            "was saved without one (a Trainer without tokenizer=...). Copy the tokenizer of the "
            "model it was trained from: load_tokenizer(SOURCE_DIR).save_pretrained(DIR)"
        )
    return (
        f"{directory} holds no tokenizer (no tokenizer.json or tokenizer_config.json): pass a "
        "tokenizer or model directory (for a run's checkpoint, .../checkpoints/step_N/model)"
    )


def _step_number(step_dir: Path) -> int:
    digits = step_dir.name.removeprefix("step_")
    return int(digits) if digits.isdigit() else -1


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
