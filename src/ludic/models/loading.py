"""Save and load any local Hugging Face causal LM directory, keeping token ids exactly stable.

transformers 5 may swap a tokenizer's class on reload based on the model type (for example a
Llama config pulls in a Metaspace `LlamaTokenizer`), which silently changes ids. Saving pins the
class to the plain `tokenizer.json` backend, and loading checks the loaded tokenizer against
`tokenizer.json` itself. A checkpoint step folder (`.../checkpoints/step_N`, the path a run
prints as its last checkpoint) loads from its `model/` subfolder, once its files match the
sizes and sha256 its MANIFEST.json recorded (`verify="size"`: sizes only; a damaged one is
refused naming the file and an earlier step that verifies, as is one without a manifest, whose
save never finished); a run folder is refused naming its latest checkpoint. Files transformers
would misread or work around (a config.json the weights do not fit, tokenizer files that are not
JSON) are refused first, naming the file (`ludic.models.model_files`). A LoRA run's checkpoint
(a peft adapter directory) loads as its base model with the adapter merged in. Nothing here
downloads from a model hub.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

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

from ludic.models.checkpoint_step import refuse_unfinished_step
from ludic.models.model_files import (
    check_chat_template,
    check_eos_tokens,
    check_finite_weights,
    check_generation_config,
    check_loading_info,
    check_tokenizer_files,
    check_tokenizer_fits,
    load_config,
    no_load_report,
    tokenizer_load_error,
)

if TYPE_CHECKING:
    from ludic.training.checkpoint_manifest import VerifyMode

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
    _restore_interrupted_resave(Path(path).expanduser())
    directory = model_directory(path)
    if not _holds_model(directory):
        raise FileNotFoundError(_not_a_model_directory(Path(path)))
    return directory


def saved_policy_version(path: str | os.PathLike[str]) -> int:
    """The policy version the weights `path` names were saved at: a training checkpoint's
    (`.../step_N` or its `model/`; the step folder's state.json), else 0 (a model directory
    outside a checkpoint holds a run's starting weights). An unreadable state.json is warned
    about, naming it, and gives 0."""
    from ludic.training.checkpoint_manifest import MANIFEST

    directory = model_directory(path)
    state = directory.parent / "state.json"
    if directory.name != "model" or not (directory.parent / MANIFEST).is_file():
        return 0  # not a step folder the Trainer wrote (it writes a manifest beside state.json)
    if not state.is_file():
        logger.warning("%s: the checkpoint has no state.json; using policy version 0", state)
        return 0
    try:
        version = json.loads(state.read_text())["policy_version"]
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"policy_version is {version!r}, not an int >= 0")
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("%s: cannot read the checkpoint's policy version (%s); using 0", state, e)
        return 0
    return version


def _restore_interrupted_resave(path: Path) -> None:
    """A step folder `path` names (`.../step_N` or `.../step_N/model`) that is missing because a
    re-save of it was killed between its renames is renamed back from its aside first."""
    for step_dir in (path, path.parent):
        if step_dir.name.startswith("step_") and not step_dir.exists():
            from ludic.training.checkpoint_scratch import restore_interrupted_resaves

            restore_interrupted_resaves(step_dir.parent)
            return


def load_model(
    path: str | os.PathLike[str],
    dtype: DTypeLike = None,
    device: str | torch.device = "cpu",
    *,
    verify: VerifyMode = "sha256",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local model directory (or a checkpoint step folder: its `model/`) as (model in
    eval mode on `device`, tokenizer). A checkpoint's files are first checked against its
    manifest: `verify="sha256"` their sizes and contents (one pass over the weights), "size"
    their sizes only (fast, but a file changed in place at the same size, a flipped bit, loads).
    A step whose save never finished (no manifest) is refused naming the last complete one."""
    from ludic.training.checkpoint_manifest import deep_verify

    deep = deep_verify(verify)  # an unknown mode is refused before anything is read
    refuse_unfinished_step(path, verify=verify)  # before its (maybe partial) model/ is judged
    directory = check_model_directory(path)
    _check_manifest(directory, deep=deep)
    if not (directory / "config.json").is_file():  # a LoRA run's checkpoint: its adapter
        return _load_merged_adapter(directory, dtype, device, verify=verify)
    config = load_config(directory)  # not JSON, or values transformers rejects: refused here
    check_generation_config(directory, getattr(config, "vocab_size", None))
    tokenizer = load_tokenizer(directory)  # its files and template: before the slow part
    try:
        with no_load_report():  # check_loading_info refuses what its table would show
            loaded = AutoModelForCausalLM.from_pretrained(
                directory,
                config=config,
                dtype=resolve_dtype(dtype),
                output_loading_info=True,
                ignore_mismatched_sizes=True,
            )
    except (OSError, SafetensorError) as e:
        raise ValueError(
            f"{directory}: the model's weights are missing or damaged ({e}); copy the folder "
            "again, or load another checkpoint"
        ) from e
    model, info = cast(tuple[PreTrainedModel, dict[str, Any]], loaded)  # with loading info
    check_loading_info(directory, info, model.base_model_prefix)
    model.to(device)  # type: ignore[arg-type]  # transformers' decorated `to` confuses mypy
    check_finite_weights(directory, model)  # on `device`: a GPU sums the tensors fastest
    _check_tokenizer_fits(directory, model, tokenizer)
    return model.eval(), tokenizer


def _check_tokenizer_fits(
    directory: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    weight = cast(torch.Tensor, model.get_input_embeddings().weight)
    check_tokenizer_fits(directory, len(tokenizer), int(weight.shape[0]))
    generation_config = getattr(model, "generation_config", None)
    check_eos_tokens(directory, tokenizer, getattr(generation_config, "eos_token_id", None))


def _load_merged_adapter(
    directory: Path, dtype: DTypeLike, device: str | torch.device, *, verify: VerifyMode
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model `directory`'s LoRA adapter names (`base_model_name_or_path`: absolute as
    ludic saves it; older checkpoints' relative paths are looked up from the current directory,
    with a warning) with the adapter merged in: a plain model, as the LoRA run's policy computes.
    Tokenizer from the adapter directory; the base is checked as `verify` says."""
    config_file = directory / ADAPTER_CONFIG
    recorded = str(json.loads(config_file.read_text()).get("base_model_name_or_path") or "")
    base = Path(recorded).expanduser()
    if not recorded or not _holds_model(model_directory(base)):
        raise FileNotFoundError(_base_not_found(directory, recorded))
    if not base.is_absolute():
        logger.warning(
            "%s names its base model by the relative path %r (saved before ludic recorded it "
            "absolute): using %s, found from the current directory; if that is not the model "
            "the LoRA run started from, run from the directory that run ran in",
            directory,
            recorded,
            base.resolve(),
        )
    from peft import PeftModel  # the LoRA run had peft: its adapter is peft's format

    from ludic.training.lora import peft_deprecation_silenced

    model, _ = load_model(base, dtype=dtype, device=device, verify=verify)
    with peft_deprecation_silenced():
        merged = PeftModel.from_pretrained(model, str(directory)).merge_and_unload()
    check_finite_weights(directory, merged)  # a NaN in the adapter spreads into its layers
    logger.info("loaded %s: LoRA adapter merged into its base model %s", directory, base)
    tokenizer = load_tokenizer(directory)
    _check_tokenizer_fits(directory, merged, tokenizer)
    return merged.eval(), tokenizer


def _base_not_found(directory: Path, recorded: str) -> str:
    """Why LoRA adapter `directory`'s recorded base `recorded` is not loaded, and the fixes
    that leave the checkpoint as saved (its MANIFEST.json records the adapter config's sha256,
    so the config is edited in a copy)."""
    base = Path(recorded).expanduser()
    edit = (
        f"or copy {directory} elsewhere and set base_model_name_or_path in its {ADAPTER_CONFIG} "
        "to that folder's absolute path"
    )
    if not recorded:
        return (
            f"{directory} holds a LoRA adapter that names no base model: {edit.removeprefix('or ')}"
        )
    if base.is_absolute():
        return (
            f"{directory} holds a LoRA adapter whose base model is not found: "
            f"base_model_name_or_path in {ADAPTER_CONFIG} is {recorded!r}, which is no local model "
            "directory. Put the base model's folder (the --model the LoRA run started from) "
            f"back at that path (a symlink will do), {edit}"
        )
    return (
        f"{directory} holds a LoRA adapter whose base model is not found: "
        f"base_model_name_or_path in {ADAPTER_CONFIG} is {recorded!r}, a relative path, looked "
        f"up from the current directory {Path.cwd()}, where it is no model directory. Run from "
        "the directory the LoRA run ran in, or put the base model's folder (the --model that "
        f"run started from) at {Path.cwd() / base} (a symlink will do), {edit}"
    )


def _check_manifest(directory: Path, *, deep: bool) -> None:
    """ValueError naming the first file of a checkpoint's `model/` that its step folder's
    MANIFEST.json lists but that is missing, of another size (a copy in part, a full disk) or,
    with `deep`, of other contents than its recorded sha256 (a bit flip: one streaming pass over
    the weights), or that it does not list, or the manifest itself when it is unreadable, and the
    newest earlier step whose `model/` verifies (checked the same way). Files recorded without a
    sha256 (older saves): sizes only. A `model/` without a manifest beside it is left to loading
    to judge (a step folder without one was refused before: `refuse_unfinished_step`)."""
    from ludic.training.checkpoint_manifest import (
        MANIFEST,
        check_files,
        earlier_good_checkpoint,
    )
    from ludic.training.weights_io import CorruptCheckpointError

    step_dir = directory.parent
    if directory.name != "model" or not (step_dir / MANIFEST).is_file():
        return
    try:  # an unreadable manifest too: it verifies nothing, as resume refuses it
        check_files(step_dir, deep=deep, prefix="model/")
    except CorruptCheckpointError as e:
        earlier = earlier_good_checkpoint(step_dir, deep=deep, prefix="model/")
        instead = (
            f"load another checkpoint: the earlier step {earlier} verifies"
            if earlier is not None
            else "load another checkpoint (no earlier step beside it verifies)"
        )
        raise ValueError(f"{e}. Copy it again, or {instead}") from e


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
    check_tokenizer_files(directory)
    raw_file = directory / "tokenizer.json"
    try:  # JSON objects that tokenizers or transformers cannot build a tokenizer from
        tokenizer = AutoTokenizer.from_pretrained(directory)
        raw = Tokenizer.from_file(str(raw_file)) if raw_file.is_file() else None
    except Exception as e:  # tokenizers raises bare Exceptions for malformed contents
        raise tokenizer_load_error(directory, e) from e
    check_chat_template(directory, tokenizer)
    if raw is None:
        return tokenizer
    expected = raw.encode(_PROBE_TEXT, add_special_tokens=False).ids
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
