"""Token ids to per-token display strings for the rollout viewer.

Three decoders: a Hugging Face style tokenizer (anything with `decode(ids)`), the byte-level
ids of `ScriptedClient` (UTF-8 bytes plus two ChatML markers), and plain ids when neither
applies. Display only: nothing here is used to build training tokens.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ludic.inference.scripted import IM_END, IM_START, VOCAB_SIZE, decode_ids
from ludic.types import Rollout

# ids -> one display string per id.
TokenDecoder = Callable[[Sequence[int]], list[str]]
_BYTE_SPECIALS = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
_AUTO_CHECK_STEPS = 32
IDS_NO_TOKENIZER = "ids (no tokenizer given)"
"""The page's "tokens shown as" when no tokenizer was given and the ids are not byte-level."""


@runtime_checkable
class TokenizerLike(Protocol):
    """The part of a Hugging Face tokenizer the viewer uses."""

    def decode(self, token_ids: Any, /) -> Any: ...


def byte_decoder(ids: Sequence[int]) -> list[str]:
    """ScriptedClient ids: bytes decoded incrementally (a multi-byte character shows on its
    last byte; earlier bytes show as hex), 256/257 as ChatML markers."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out: list[str] = []
    for t in ids:
        if t in _BYTE_SPECIALS:
            decoder.reset()
            out.append(_BYTE_SPECIALS[t])
        elif 0 <= t < 256:
            text = decoder.decode(bytes([t]))
            out.append(text if text else f"\\x{t:02x}")
        else:
            out.append(f"[{t}]")
    return out


def id_decoder(ids: Sequence[int]) -> list[str]:
    """No tokenizer: every token shows as its id."""
    return [f"[{t}]" for t in ids]


def tokenizer_decoder(tokenizer: TokenizerLike) -> TokenDecoder:
    """Per-token `tokenizer.decode([id])`, cached per id (a lone token of a multi-byte
    character may show as U+FFFD; the message text above the tokens is exact)."""
    cache: dict[int, str] = {}

    def decode(ids: Sequence[int]) -> list[str]:
        out: list[str] = []
        for t in ids:
            text = cache.get(t)
            if text is None:
                decoded = tokenizer.decode([t])
                text = decoded if isinstance(decoded, str) else str(decoded)
                cache[t] = text
            out.append(text)
        return out

    return decode


def looks_byte_level(rollouts: Iterable[Rollout]) -> bool:
    """True when the traces look like ScriptedClient's: every checked id is below its vocab
    size and each completion's bytes decode to the completion text."""
    checked = 0
    for rollout in rollouts:
        for step in rollout.agent_steps:
            trace = step.trace
            if trace is None:
                continue
            ids = (*trace.prompt_token_ids, *trace.completion_token_ids)
            if any(not 0 <= t < VOCAB_SIZE for t in ids):
                return False
            if decode_ids(trace.completion_token_ids) != step.completion:
                return False
            checked += 1
            if checked >= _AUTO_CHECK_STEPS:
                return True
    return checked > 0


def _check_tokenizer_dir(directory: Path) -> None:
    """Raise FileNotFoundError when `directory` does not exist, naming the checkpoints that do
    when it looks like one (`.../checkpoints/step_N/model`)."""
    if directory.is_dir():
        return
    hint = "give a model or tokenizer directory (a checkpoint's .../model), 'bytes' or 'ids'"
    checkpoints = directory.parent.parent
    if directory.name == "model" and checkpoints.is_dir():
        found = sorted(p.name for p in checkpoints.iterdir() if (p / "model").is_dir())
        if found:
            hint = f"checkpoints in {checkpoints}: {', '.join(found[-3:])}"
    raise FileNotFoundError(f"tokenizer directory {directory} does not exist; {hint}")


def resolve_decoder(
    tokenizer: TokenizerLike | str | Path | None, rollouts: Sequence[Rollout]
) -> tuple[TokenDecoder, str]:
    """A decoder and its name: a tokenizer object, "bytes", "ids", a local tokenizer/model
    directory (str or Path), or None (auto: bytes when the traces look byte-level, else ids)."""
    if isinstance(tokenizer, Path):
        tokenizer = str(tokenizer)
    if tokenizer is None:
        if looks_byte_level(rollouts):
            return byte_decoder, "bytes (auto-detected)"
        return id_decoder, IDS_NO_TOKENIZER
    if isinstance(tokenizer, str):
        if tokenizer == "bytes":
            return byte_decoder, "bytes"
        if tokenizer == "ids":
            return id_decoder, "ids"
        from ludic.models.loading import load_tokenizer  # imports transformers: only on demand

        _check_tokenizer_dir(Path(tokenizer))
        return tokenizer_decoder(load_tokenizer(tokenizer)), tokenizer
    if not isinstance(tokenizer, TokenizerLike):
        raise TypeError(
            f"tokenizer must have a decode(ids) method, or be 'bytes', 'ids' or a tokenizer "
            f"directory; got {type(tokenizer).__name__}"
        )
    return tokenizer_decoder(tokenizer), _tokenizer_name(tokenizer)


def _tokenizer_name(tokenizer: TokenizerLike) -> str:
    """The directory a Hugging Face tokenizer was loaded from, else its class: a checkpoint's
    tokenizer lives in `.../step_N/model`, so a bare class or folder name says nothing."""
    source = getattr(tokenizer, "name_or_path", None)
    return source if isinstance(source, str) and source else type(tokenizer).__name__
