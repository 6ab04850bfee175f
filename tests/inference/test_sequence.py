"""SequenceState's stop strings: checking only the text's tail finishes exactly where checking
the whole decoded completion would."""

from __future__ import annotations

import torch
from codec_fakes import CountingCodec, tiny_codec
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.inference.embedded.sequence import SequenceState

STOPS = ("</move>", "日本", "🙂", "ab", "\n\n", "é x")
FRAGMENTS = ("</move>", "</mo", "日本", "本", "🙂", "a", "b", "\n", "é", " x", "hello")


def whole_text_rule(ids: list[int], stop: tuple[str, ...]) -> tuple[int, str] | None:
    """Tokens fed and text of the first prefix whose decoded text holds a stop string."""
    for n in range(1, len(ids) + 1):
        text = tiny_codec().decode(ids[:n])
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return n, text[: min(hits)]
    return None


def fed(ids: list[int], stop: tuple[str, ...]) -> SequenceState:
    seq = SequenceState(
        prompt_ids=[1],
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_tokens=10**6,
        generator=torch.Generator(),
        stop=stop,
    )
    for token in ids:
        seq.append(token, 0.0, forced=False, codec=tiny_codec())
        if seq.done:
            break
    return seq


# Token lists built from fragments that make and split stop strings, special tokens and noise.
pieces = st.one_of(
    st.sampled_from(FRAGMENTS).map(lambda text: tiny_codec().encode(text)),
    st.integers(min_value=0, max_value=560).map(lambda token: [token]),
)
token_lists = st.lists(pieces, max_size=30).map(lambda parts: [t for p in parts for t in p])


@settings(max_examples=300, deadline=None)
@given(ids=token_lists, stop=st.lists(st.sampled_from(STOPS), min_size=1, max_size=3).map(tuple))
def test_tail_checks_stop_where_the_whole_text_rule_stops(
    ids: list[int], stop: tuple[str, ...]
) -> None:
    seq = fed(ids, stop)
    expected = whole_text_rule(ids, stop)
    if expected is None:
        assert seq.finish_reason is None and len(seq.completion_ids) == len(ids)
    else:
        n, text = expected
        assert seq.finish_reason == "stop" and len(seq.completion_ids) == n
        assert seq.text == text


def test_a_long_completion_decodes_only_its_tail_per_token() -> None:
    counting = CountingCodec()
    seq = fed([], ("</move>",))
    for token in tiny_codec().encode("word " * 400):
        seq.append(token, 0.0, forced=False, codec=counting)
    assert seq.finish_reason is None and len(seq.completion_ids) >= 400
    assert max(counting.decoded) < 40  # never the whole completion
