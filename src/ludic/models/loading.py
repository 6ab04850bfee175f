"""Save and load any local Hugging Face causal LM directory, keeping token ids exactly stable.

transformers 5 may swap a tokenizer's class on reload based on the model type (for example a
Llama config pulls in a Metaspace `LlamaTokenizer`), which silently changes ids. Saving pins the
class to the plain `tokenizer.json` backend, and loading checks the loaded tokenizer against
`tokenizer.json` itself. Nothing here downloads from a model hub.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
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


def load_model(
    path: str | os.PathLike[str],
    dtype: DTypeLike = None,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local model directory as (model in eval mode on `device`, tokenizer)."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"{directory} is not a local model directory (no config.json). Ludic never downloads "
            "from a model hub: download the model yourself, or build one with "
            "ludic.models.tiny_model_dir()."
        )
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=resolve_dtype(dtype))
    model.to(device)  # type: ignore[arg-type]  # transformers' decorated `to` confuses mypy
    return model.eval(), load_tokenizer(directory)


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """AutoTokenizer, replaced by the plain `tokenizer.json` backend if the two disagree on ids."""
    directory = Path(path)
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(
            f"{directory} holds no tokenizer (no tokenizer.json or tokenizer_config.json): it "
            "was saved without one (a Trainer without tokenizer=...). Copy the tokenizer of the "
            "model it was trained from: load_tokenizer(SOURCE_DIR).save_pretrained(DIR)"
        )
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
