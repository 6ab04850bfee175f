"""Streaming a completion as it is generated: token deltas, and text deltas that are never taken
back.

`EmbeddedEngine.stream` yields `CompletionDelta`s (the ids and behaviour logprobs sampled since
the previous one; the last carries the whole `ChatResponse`). `TextStream` turns the growing ids
into text for a client: text that may still change is held back until it settles (an unfinished
UTF-8 character, whose bytes span several tokens) and so is text that may be the start of a stop
string (the final text is cut before a stop string, as without streaming). The concatenated
deltas equal the non-streamed response's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ludic.inference.client import ChatResponse
from ludic.inference.embedded.sequence import TextCodec, first_stop

_UNFINISHED = "\ufffd"  # what decoding the first bytes of a multi-byte character gives


@dataclass(frozen=True, kw_only=True, slots=True)
class CompletionDelta:
    """Ids and logprobs sampled since the previous delta. The first delta of a stream also
    carries the prompt ids; the last carries the finished `response` (its ids are the whole
    completion), the others None."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_token_ids: tuple[int, ...] = ()
    response: ChatResponse | None = None


class TextStream:
    """Text deltas of a growing completion, each settled: `push(ids)` with all ids so far, then
    `finish(text)` with the response's final text.

    Decoding is incremental (vLLM's offsets): each push decodes only the tokens since the last
    settled point, together with the chunk before them so that tokenizers whose decoding
    depends on the previous token (a SentencePiece leading space) decode them as in context.
    """

    def __init__(self, codec: TextCodec, stop: Sequence[str] = ()) -> None:
        self.codec = codec
        self.stop = tuple(s for s in stop if s)
        self.sent = 0  # characters sent: a prefix of `_text` holding no start of a stop string
        self._text = ""  # decoded text of ids[:self._read]
        self._prefix = self._read = 0  # the chunk before the unsettled tokens: ids[prefix:read]

    def push(self, completion_ids: Sequence[int]) -> str:
        """The newly settled text (possibly "")."""
        before = self.codec.decode(completion_ids[self._prefix : self._read])
        now = self.codec.decode(completion_ids[self._prefix :])
        if len(now) > len(before) and not now.endswith(_UNFINISHED):
            self._text += now[len(before) :]
            self._prefix, self._read = self._read, len(completion_ids)
        hit = first_stop(self._text, self.stop, self.sent)  # stops begin in held-back text only
        fresh = self._text[self.sent : len(self._text) if hit is None else hit[0]]
        delta = fresh[: len(fresh) - self._stop_prefix(fresh)]
        self.sent += len(delta)
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` after what was sent. What was sent is a prefix of the final
        text unless the tokenizer decodes earlier text differently once later tokens arrive
        (`clean_up_tokenization_spaces`); then what was sent stands and the final text beyond
        its length follows."""
        delta = final_text[self.sent :]
        self.sent = len(final_text)
        return delta

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
