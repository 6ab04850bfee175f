"""`foreign_token_ids`, the check `ludic view` warns with and `ludic sft` refuses data with: a
completion whose recorded text holds nothing but U+FFFD (a cut-off byte sequence, common in a
fresh tiny model's replies) decodes to U+FFFD under almost any byte-level tokenizer, so it is
no evidence either way and must not pass another tokenizer's ids as these."""

from __future__ import annotations

from collections.abc import Sequence

from ludic.rollouts.token_check import foreign_token_ids
from ludic.types import AgentStep, Rollout, TokenTrace


def rollout(*completions: tuple[str, tuple[int, ...]]) -> Rollout:
    steps = [
        AgentStep(
            turn_id=f"t{i}",
            prompt_messages=({"role": "user", "content": "?"},),
            completion=text,
            trace=TokenTrace(prompt_token_ids=(1,), completion_token_ids=ids),
        )
        for i, (text, ids) in enumerate(completions)
    ]
    return Rollout(steps=steps)


def other_tokenizer(ids: Sequence[int]) -> str:
    """Another tokenizer's decode of these ids: junk, and U+FFFD for a partial byte."""
    return "".join("\ufffd" if i == 145 else f"<{i}>" for i in ids)


def test_a_completion_of_replacement_characters_only_is_no_evidence() -> None:
    episodes = [rollout(("\ufffd", (145, 0)), ("lamp 2", (7, 8, 9)), ("\ufffd \ufffd", (145, 145)))]
    found = foreign_token_ids(episodes, [other_tokenizer])
    assert found is not None  # was None: the lone U+FFFD "decoded to its text"
    assert found.checked == 1 and found.text == "lamp 2"


def test_the_right_tokenizer_still_passes_and_text_around_a_replacement_char_counts() -> None:
    own = {7: "lamp", 8: " ", 9: "2", 145: "\ufffd", 3: "x"}
    decode = lambda ids: "".join(own.get(i, "") for i in ids)  # noqa: E731
    assert foreign_token_ids([rollout(("lamp 2", (7, 8, 9)))], [decode]) is None
    assert foreign_token_ids([rollout(("x\ufffd", (3, 145)))], [decode]) is None
    # only uninformative completions: nothing to judge, so no verdict either way
    assert foreign_token_ids([rollout(("\ufffd", (145,)))], [other_tokenizer]) is None
