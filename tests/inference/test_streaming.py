"""TextStream: streamed text is settled (never taken back) and adds up to the final text."""

from __future__ import annotations

from codec_fakes import CountingCodec, tiny_codec
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.inference.embedded.streaming import TextStream

STOPS = ("</move>", "\n\n", "ab")


def streamed(ids: list[int], stop: tuple[str, ...] = ()) -> list[str]:
    """The text deltas of feeding `ids` one token at a time (without the final flush)."""
    stream = TextStream(tiny_codec(), stop)
    return [stream.push(ids[: n + 1]) for n in range(len(ids))]


def final_text(ids: list[int], stop: tuple[str, ...]) -> str:
    """The engine's response text: the decoded completion cut before the first stop string."""
    text = tiny_codec().decode(ids)
    hits = [text.find(s) for s in stop if s in text]
    return text[: min(hits)] if hits else text


def test_a_character_split_over_tokens_is_sent_once_whole() -> None:
    ids = tiny_codec().encode("I 🙂 日本")
    deltas = streamed(ids)
    assert "\ufffd" not in "".join(deltas)
    assert "".join(deltas) == "I 🙂 日本"
    assert "🙂" in deltas and "日" in deltas  # each sent when its last byte arrived


def test_text_that_may_begin_a_stop_string_is_held_back() -> None:
    stream = TextStream(tiny_codec(), ["</move>"])
    ids = tiny_codec().encode("<move>5</move> and more")
    sent = [stream.push(ids[: n + 1]) for n in range(len(ids))]
    assert "".join(sent) == "<move>5"  # "</", "</move" were held, then cut at the stop string
    assert stream.finish("<move>5") == ""
    other = TextStream(tiny_codec(), ["</move>"])
    partial = tiny_codec().encode("x</")
    assert other.push(partial) == "x"
    assert other.push(partial + tiny_codec().encode("b")) == "</b"  # not a stop after all


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(min_value=0, max_value=560), max_size=40),
    stop=st.lists(st.sampled_from(STOPS), max_size=2, unique=True).map(tuple),
)
def test_deltas_are_prefixes_of_the_final_text_and_add_up_to_it(
    ids: list[int], stop: tuple[str, ...]
) -> None:
    final = final_text(ids, stop)
    stream = TextStream(tiny_codec(), stop)
    sent = ""
    for n in range(len(ids)):
        sent += stream.push(ids[: n + 1])
        assert final.startswith(sent)  # nothing sent is ever taken back
    assert sent + stream.finish(final) == final


def test_each_push_decodes_only_the_newest_tokens() -> None:
    counting = CountingCodec()
    stream = TextStream(counting, ["</move>"])
    ids = tiny_codec().encode("word 日本 " * 200)
    text = "".join(stream.push(ids[: n + 1]) for n in range(len(ids)))
    assert text == "word 日本 " * 200
    assert max(counting.decoded) < 10  # no push decoded the whole completion
