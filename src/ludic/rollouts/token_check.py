"""Do these rollouts' token ids belong to this tokenizer? One check for every reader of stored
rollouts that decodes their ids with a tokenizer of its own (`ludic sft`, `ludic view`).

The rollout records each completion both as text and as the ids the server sampled; ids from
another tokenizer still decode, to nonsense (" looks4 good" for "<move>4</move>"). The check
decodes the first few completions and passes when one of them decodes to text containing the
recorded text (a stop string may be cut from the text; whitespace is ignored, so a tokenizer
decoded one token at a time still matches). Completions that are empty or nothing but U+FFFD
(a cut-off byte sequence: another tokenizer's decode shows it too) are no evidence and are
skipped. It reads ids and text only: it neither loads a tokenizer nor rebuilds ids (that is
`ChatTemplateRetokenizer`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ludic.types import Rollout

REPLACEMENT_CHAR = "\ufffd"

TextDecoder = Callable[[Sequence[int]], str]
"""Token ids -> text (e.g. `lambda ids: tokenizer.decode(ids)`)."""


@dataclass(frozen=True, slots=True)
class ForeignTokenIds:
    """Evidence that the ids are another tokenizer's: `checked` completions, none of which
    decodes to its recorded text; `text` and `decoded` are the first one."""

    checked: int
    text: str
    decoded: str

    def describe(self, source: str, whose: str = "this tokenizer's") -> str:
        """One sentence naming the mismatch, e.g. for an error or a warning: "the token ids
        in SOURCE are not WHOSE: ..."."""
        return (
            f"the token ids in {source} are not {whose}: none of the first "
            f"{self.checked} completions decodes to its recorded text (e.g. {self.text!r} "
            f"decodes to {self.decoded!r}), so the rollouts were tokenized by another tokenizer"
        )


def foreign_token_ids(
    rollouts: Iterable[Rollout], decoders: Sequence[TextDecoder], *, max_checked: int = 16
) -> ForeignTokenIds | None:
    """None when one of the first `max_checked` completions (with text and completion ids)
    decodes, by any of `decoders`, to text containing its recorded text, or when there is
    nothing to check; else the evidence that the ids are another tokenizer's."""
    checked: list[tuple[str, str]] = []
    for rollout in rollouts:
        for step in rollout.agent_steps:
            text = step.completion.strip()
            if step.trace is None or not _informative(text) or not step.trace.completion_token_ids:
                continue
            ids = list(step.trace.completion_token_ids)
            decoded = [str(decode(ids)) for decode in decoders]
            if any(_contains(d, text) for d in decoded):
                return None
            checked.append((text, decoded[0] if decoded else ""))
            if len(checked) >= max_checked:
                return ForeignTokenIds(len(checked), *checked[0])
    return ForeignTokenIds(len(checked), *checked[0]) if checked else None


def _informative(text: str) -> bool:
    """Whether `text` can tell tokenizers apart: not empty, and not only U+FFFD (a cut-off
    byte sequence, which nearly any byte-level tokenizer's decode also contains)."""
    return bool(text.replace(REPLACEMENT_CHAR, "").strip())


def _contains(decoded: str, text: str) -> bool:
    return text in decoded or "".join(text.split()) in "".join(decoded.split())


__all__ = ["ForeignTokenIds", "TextDecoder", "foreign_token_ids"]
