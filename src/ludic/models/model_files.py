"""A model directory's files that transformers would misread or silently work around, refused
in one line naming the file, what is wrong and what to do: a config.json, generation_config.json
or tokenizer JSON file that is not a JSON object, a generation_config.json whose token ids are
not token ids (the embedded engine stops at its eos_token_id), a config.json transformers cannot build a model from, weights that
do not fit config.json (transformers initialises missing tensors at random and drops unused
ones, with a warning table), weights holding a NaN or an infinity, tokenizer files that do not
load, a chat template that does not compile or renders no assistant turn, and a tokenizer with
more tokens than the model's embedding has rows.

It does not check a checkpoint's files against its MANIFEST.json (`ludic.models.loading`) and
never edits a file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ludic.errors import LudicUsageError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_SAVED_WITH = "restore the file saved with these weights (copy the folder again)"


def read_json_object(file: Path) -> dict[str, Any]:
    """`file` parsed as a JSON object; LudicUsageError naming it when it is unreadable, not
    UTF-8, not JSON or not an object."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise LudicUsageError(f"{file}: not UTF-8 text ({e}); {_SAVED_WITH}") from e
    except OSError as e:
        raise LudicUsageError(f"{file}: cannot be read ({e}); {_SAVED_WITH}") from e
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        what = "empty" if not text.strip() else f"not valid JSON ({e})"
        raise LudicUsageError(f"{file}: {what}; {_SAVED_WITH}") from e
    if not isinstance(value, dict):
        raise LudicUsageError(
            f"{file}: a JSON {type(value).__name__}, not the JSON object it must hold; "
            f"{_SAVED_WITH}"
        )
    return value


def load_config(directory: Path) -> Any:
    """The `PretrainedConfig` of `directory`'s config.json; LudicUsageError naming the file when
    it is not a JSON object or transformers rejects its values (a wrong type, an impossible
    size, no model_type)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    file = directory / "config.json"
    read_json_object(file)
    try:
        return AutoConfig.from_pretrained(directory)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as e:
        raise LudicUsageError(
            f"{directory}: transformers cannot build a model from its config.json "
            f"({_one_line(e)}); a model directory holds the config.json that `save_pretrained` "
            f"writes (with its model_type): {_SAVED_WITH}"
        ) from e


def check_generation_config(directory: Path, vocab_size: object) -> None:
    """LudicUsageError naming `directory`'s generation_config.json when it is not a JSON object
    (transformers then ignores it without a word, so the model stops at config.json's eos ids
    instead) or when its eos_token_id (the embedded engine stops there) is not an id of the
    model's `vocab_size` tokens. Its other fields are not ludic's (a pad_token_id of -1, as
    older conversions have, loads): sampling comes from the SamplingConfig, and transformers
    warns about values it cannot use."""
    file = directory / GENERATION_CONFIG
    if not file.is_file():
        return
    values = read_json_object(file)
    value = values.get("eos_token_id")
    ids = value if isinstance(value, list) else [value]
    if value is None or all(_is_token_id(i, vocab_size) for i in ids):
        return
    span = f"from 0 to {vocab_size - 1}" if isinstance(vocab_size, int) else ">= 0"
    raise LudicUsageError(
        f"{file}: eos_token_id is {json.dumps(value)}, not a token id of this model (an int "
        f"{span} or a list of them: the embedded engine stops at them); {_SAVED_WITH}, or "
        "delete the file (config.json's token ids then apply)"
    )


GENERATION_CONFIG = "generation_config.json"


def _is_token_id(value: object, vocab_size: object) -> bool:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return False
    return not isinstance(vocab_size, int) or value < vocab_size


@contextmanager
def no_load_report() -> Iterator[None]:
    """Hold back transformers' LOAD REPORT table while a model loads: `check_loading_info`
    refuses what it reports, in one line. Its "Loading weights" bar goes too: it showed under
    `ludic eval --no-progress` and in every log, for a load that takes well under a second."""
    from transformers.utils import logging as hf_logging

    hf_logger = hf_logging.get_logger("transformers.modeling_utils")
    drop_report = _DropLoadReport()
    hf_logger.addFilter(drop_report)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logger.removeFilter(drop_report)
        if bars:
            hf_logging.enable_progress_bar()


class _DropLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


def check_loading_info(directory: Path, info: Mapping[str, Any], base_prefix: str) -> None:
    """LudicUsageError when the weights in `directory` do not fit its config.json, from
    `from_pretrained(..., output_loading_info=True, ignore_mismatched_sizes=True)`'s `info`: a
    tensor of another shape, a tensor the model needs that the weights lack (transformers would
    initialise it at random), or a backbone tensor (under `base_prefix`) the model has no place
    for (a config.json with fewer layers than the weights). Extra tensors outside the backbone
    (a value head saved beside the LM) are allowed."""
    mismatched = sorted(info.get("mismatched_keys") or ())
    missing = sorted(info.get("missing_keys") or ())
    unused = sorted(k for k in info.get("unexpected_keys") or () if k.startswith(f"{base_prefix}."))
    if mismatched:
        key, saved, built = mismatched[0]
        problem = (
            f"{key} is {list(saved)} in the weights but {list(built)} in config.json's model "
            f"({_count(len(mismatched), 'tensor')} of another shape)"
        )
    elif missing:
        problem = (
            f"config.json's model needs {missing[0]}, which the weights lack "
            f"({_count(len(missing), 'tensor')} missing, which would start at random values)"
        )
    elif unused:
        problem = (
            f"the weights hold {unused[0]}, which config.json's model has no place for "
            f"({_count(len(unused), 'tensor')} unused: config.json describes a smaller model)"
        )
    else:
        return
    raise LudicUsageError(
        f"{directory}: the weights do not fit config.json: {problem}. One of the two was "
        "edited or comes from another model: restore the config.json and weights saved together "
        "(copy the folder again)"
    )


def check_finite_weights(directory: Path, model: torch.nn.Module) -> None:
    """LudicUsageError naming the first parameter of `model` (loaded from `directory`) that holds
    a NaN or an infinity: such a model outputs NaN logits, so every episode samples garbage or
    fails far from the cause. One float sum per tensor finds the suspects (`checksum.nonfinite`);
    only they are checked element by element."""
    from ludic.distributed.checksum import nonfinite

    bad = nonfinite(dict(model.named_parameters()))
    if not bad:
        return
    tensor = model.get_parameter(bad[0]).detach()
    nans, infs = int(tensor.isnan().sum()), int(tensor.isinf().sum())
    more = f"; {_count(len(bad) - 1, 'more tensor')} too" if len(bad) > 1 else ""
    raise LudicUsageError(
        f"{directory}: the weights hold non-finite values: {bad[0]} has {nans} NaN and {infs} "
        f"infinite of its {tensor.numel()} values{more}. A model with them outputs NaN logits; "
        "they were saved from a run whose weights diverged, or the file was edited: load an "
        "earlier checkpoint, or the model the run started from"
    )


def check_tokenizer_files(directory: Path) -> None:
    """LudicUsageError naming the first tokenizer file in `directory` that is present but not a
    JSON object (transformers would raise json's bare "Expecting value")."""
    for name in TOKENIZER_FILES:
        if (directory / name).is_file():
            read_json_object(directory / name)


def tokenizer_load_error(directory: Path, error: Exception) -> LudicUsageError:
    """The refusal for tokenizer files in `directory` that are JSON objects but do not load."""
    return LudicUsageError(
        f"{directory}: the tokenizer does not load from its files ({type(error).__name__}: "
        f"{_one_line(error)}); copy tokenizer.json and tokenizer_config.json again from the model "
        "these weights were saved with"
    )


def check_chat_template(directory: Path, tokenizer: Any) -> None:
    """LudicUsageError naming the file that holds `tokenizer`'s chat template (loaded from
    `directory`) when the template does not compile (a Jinja syntax error), fails on a plain
    user / assistant / user conversation, or drops the assistant's turn from it (episodes would
    lose the policy's own replies from their history). Every episode's first prompt would raise
    or be wrong, far from the file. A tokenizer without a template is left alone (a base model
    trained on pre-tokenized samples needs none)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return
    file = _chat_template_file(directory)
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in _TEMPLATE_PROBE], add_generation_prompt=True, tokenize=False
        )
    except Exception as e:  # a template's Jinja code may raise anything
        line = getattr(e, "lineno", None)
        where = f" at line {line}" if isinstance(line, int) else ""
        what = (
            "does not compile"
            if type(e).__name__ == "TemplateSyntaxError"
            else "fails on a plain user / assistant / user conversation"
        )
        raise LudicUsageError(
            f"{file}: the chat template {what}{where} ({type(e).__name__}: {_one_line(e)}); "
            f"fix its Jinja code, or {_TEMPLATE_FIX}"
        ) from e
    missing = [m["content"] for m in _TEMPLATE_PROBE if m["content"] not in str(text)]
    if missing:
        raise LudicUsageError(
            f"{file}: the chat template renders no {_role_of(missing[0])} turn: the message "
            f"{missing[0]!r} is missing from its rendering of a plain user / assistant / user "
            f"conversation, so episodes would lose it from their history; {_TEMPLATE_FIX}"
        )


_TEMPLATE_PROBE = (
    {"role": "user", "content": "Ludic probe one"},
    {"role": "assistant", "content": "Ludic probe two"},
    {"role": "user", "content": "Ludic probe three"},
)
_TEMPLATE_FIX = "restore the template saved with this tokenizer (copy the folder again)"


def _role_of(content: str) -> str:
    return next(m["role"] for m in _TEMPLATE_PROBE if m["content"] == content)


def _chat_template_file(directory: Path) -> Path:
    """The file transformers read the chat template from: chat_template.jinja when present
    (transformers 5 saves it there), else the older chat_template.json or tokenizer_config.json."""
    for name in ("chat_template.jinja", "chat_template.json"):
        if (directory / name).is_file():
            return directory / name
    return directory / "tokenizer_config.json"


def check_tokenizer_fits(directory: Path, tokenizer_size: int, embedding_rows: int) -> None:
    """LudicUsageError when the tokenizer has more tokens than the model's input embedding has
    rows: ids at or past the last row would index past it (a crash, or garbage on a GPU)."""
    if tokenizer_size > embedding_rows:
        raise LudicUsageError(
            f"{directory}: the tokenizer has {tokenizer_size} tokens but the model's embedding "
            f"only {embedding_rows} rows, so token ids {embedding_rows} and above have no "
            "embedding: the tokenizer files come from another model. Restore the tokenizer.json "
            "and tokenizer_config.json saved with these weights (copy the folder again)"
        )


def check_eos_tokens(directory: Path, tokenizer: Any, eos_token_id: object) -> None:
    """LudicUsageError when an id the model stops generating at (`eos_token_id` of its
    generation config: generation_config.json, else config.json) is an ordinary token of the
    tokenizer, not one of its added special tokens: the tokenizer files come from another model
    (generation would stop at that ordinary token, and token ids mean other text)."""
    ids = eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
    added = getattr(tokenizer, "added_tokens_decoder", {})
    for token_id in ids:
        if not isinstance(token_id, int) or token_id in added or token_id >= len(tokenizer):
            continue
        token = tokenizer.convert_ids_to_tokens(token_id)
        raise LudicUsageError(
            f"{directory}: the model stops generating at token id {token_id} (its eos_token_id), "
            f"which the tokenizer holds as the ordinary token {token!r}, not a special token: "
            "the tokenizer files come from another model. Restore the tokenizer.json and "
            "tokenizer_config.json saved with these weights (copy the folder again)"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _one_line(error: BaseException) -> str:
    """`error`'s message without line breaks (transformers' span several lines)."""
    return " ".join(str(error).split()) or type(error).__name__
