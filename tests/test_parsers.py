"""Parsers: every success and failure path, composition, fuzzing (they never raise), and linear
time on hostile input with the same results as the first, quadratic versions."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.parsers import (
    DEFAULT_PENALTY,
    Parser,
    boxed_parser,
    compose_parsers,
    identity_parser,
    tag_blocks,
    think_prefix_parser,
    xml_tag_parser,
)
from ludic.types import ParseResult


def test_xml_tag_takes_the_last_tag_and_strips() -> None:
    parse = xml_tag_parser("move", success_reward=0.1)
    assert parse("<move>1</move> then <move>\n 2 \n</move>") == ParseResult(action="2", reward=0.1)
    assert xml_tag_parser("move", strip=False)("<move> 3 </move>").action == " 3 "


@pytest.mark.parametrize(
    ("text", "feedback"),
    [
        ("no tag at all", "Could not find <move>...</move>"),
        ("<move>unclosed", "Could not find <move>...</move>"),
        ("<Move>1</Move>", "Could not find <move>...</move>"),
        ("<move>  </move>", "<move> was empty"),
    ],
)
def test_xml_tag_failures_carry_penalty_and_feedback(text: str, feedback: str) -> None:
    result = xml_tag_parser("move", penalty=-0.5)(text)
    assert result.action is None and result.reward == -0.5 and not result.ok
    assert result.obs is not None and feedback in result.obs
    assert "<move>...</move>" in result.obs  # the hint says how to answer


def test_xml_tag_exactly_one() -> None:
    parse = xml_tag_parser("a", exactly_one=True)
    assert parse("<a>x</a>").action == "x"
    result = parse("<a>x</a><a>y</a>")
    assert result.action is None and result.reward == DEFAULT_PENALTY
    assert result.obs is not None and "Found 2 <a> tags" in result.obs


def test_xml_tag_refuses_a_bad_tag_name() -> None:
    with pytest.raises(ValueError, match="not a valid tag name"):
        xml_tag_parser("bad tag")


def test_think_prefix() -> None:
    parse = think_prefix_parser(success_reward=0.2)
    assert parse("  <think>hmm</think> answer ") == ParseResult(action="answer", reward=0.2)
    missing = parse("answer")
    assert missing.action is None and missing.reward == DEFAULT_PENALTY
    unclosed = parse("<think>still thinking")
    assert unclosed.action is None and unclosed.obs is not None and "never closed" in unclosed.obs
    nothing_after = parse("<think>done</think>   ")
    assert nothing_after.action is None and nothing_after.obs is not None
    assert "answer after </think>" in nothing_after.obs


def test_think_prefix_optional() -> None:
    parse = think_prefix_parser(require=False)
    assert parse(" plain ").action == "plain"
    assert parse("<think>a</think>b").action == "b"
    assert parse("<think>unclosed").action is None  # an open block always fails
    assert parse("   ").action is None  # and so does an empty answer


def test_boxed_handles_nested_braces_and_takes_the_last_balanced_box() -> None:
    parse = boxed_parser(success_reward=1.0)
    assert parse(r"so \boxed{\frac{1}{2}}.") == ParseResult(action=r"\frac{1}{2}", reward=1.0)
    assert parse(r"\boxed{1} then \boxed{ {2} }").action == "{2}"
    # The last box is unbalanced: fall back to the previous balanced one.
    assert parse(r"\boxed{7} and \boxed{8").action == "7"


@pytest.mark.parametrize("text", ["no box", r"\boxed{}", r"\boxed{  }", r"\boxed{open"])
def test_boxed_failures(text: str) -> None:
    result = boxed_parser(penalty=-2.0)(text)
    assert result.action is None and result.reward == -2.0
    assert result.obs is not None and "\\boxed{...}" in result.obs


def test_compose_applies_in_order_and_sums_rewards() -> None:
    parse = compose_parsers(
        think_prefix_parser(success_reward=0.1), xml_tag_parser("move", success_reward=0.2)
    )
    ok = parse("<think>x</think><move>5</move>")
    assert ok.action == "5" and ok.reward == pytest.approx(0.3) and ok.obs is None
    # The first parser fails: its penalty only, its feedback.
    first = parse("<move>5</move>")
    assert first.action is None and first.reward == pytest.approx(DEFAULT_PENALTY)
    assert first.obs is not None and "<think>" in first.obs
    # The second fails after the first succeeded: rewards so far plus the penalty.
    second = parse("<think>x</think>no move")
    assert second.action is None and second.reward == pytest.approx(0.1 + DEFAULT_PENALTY)
    assert second.obs is not None and "<move>" in second.obs
    # Order matters: the tag parser first leaves no think block for the second parser.
    reversed_order = compose_parsers(xml_tag_parser("move"), think_prefix_parser())
    assert reversed_order("<think>x</think><move>5</move>").action is None


def test_compose_needs_a_parser() -> None:
    with pytest.raises(ValueError, match="at least one parser"):
        compose_parsers()


def test_identity() -> None:
    assert identity_parser("  x \n") == ParseResult(action="x")


# ---- fuzz: malformed completions never raise ---------------------------------------------

PARSERS: list[Parser] = [
    identity_parser,
    xml_tag_parser("move"),
    xml_tag_parser("answer", exactly_one=True),
    think_prefix_parser(),
    think_prefix_parser(require=False),
    boxed_parser(),
    compose_parsers(think_prefix_parser(), xml_tag_parser("move"), boxed_parser()),
]
FRAGMENTS = [
    "<think>",
    "</think>",
    "<move>",
    "</move>",
    "<answer>",
    "</answer>",
    "\\boxed{",
    "{",
    "}",
    "<tool_call>",
    "</tool_call>",
    '{"name": ',
    "\x00",
    "é",
    "🤖",
    "\n",
]
completions = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=20).map("".join)


@settings(max_examples=150, deadline=None)
@given(completions)
def test_parsers_never_raise_and_failures_always_explain(text: str) -> None:
    for parse in PARSERS:
        result = parse(text)
        assert isinstance(result, ParseResult)
        if result.action is None:
            assert result.obs  # a failure always tells the model what to do
            assert result.reward < 0


# ---- linear time: the same results as the first (regex / rescanning) versions -----------------


def reference_xml_tag(tag: str, text: str, *, exactly_one: bool = False) -> ParseResult:
    """The first xml_tag_parser (a lazy DOTALL regex; quadratic on repeated unclosed tags)."""
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
    hint = f"Reply with your answer inside <{tag}>...</{tag}>."
    if not matches:
        return ParseResult(
            action=None, reward=-1.0, obs=f"Could not find <{tag}>...</{tag}>. {hint}"
        )
    if exactly_one and len(matches) > 1:
        return ParseResult(
            action=None,
            reward=-1.0,
            obs=f"Found {len(matches)} <{tag}> tags; give exactly one. {hint}",
        )
    if f"<{tag}>" in matches[-1]:
        return ParseResult(
            action=None,
            reward=-1.0,
            obs=f"Found <{tag}> inside <{tag}>...</{tag}>; do not nest them. {hint}",
        )
    value = matches[-1].strip()
    if not value:
        return ParseResult(action=None, reward=-1.0, obs=f"<{tag}> was empty. {hint}")
    return ParseResult(action=value)


def reference_last_boxed(text: str) -> str | None:
    """The first boxed scan: from each box, last first, scan forward for balance (quadratic)."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        i = start + len("\\boxed{")
        depth, j = 1, i
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            return text[i : j - 1]
        start = text.rfind("\\boxed{", 0, start)
    return None


def reference_boxed(text: str) -> ParseResult:
    value = reference_last_boxed(text)
    if value is None or not value.strip():
        return ParseResult(action=None, reward=-1.0, obs="Put your final answer in \\boxed{...}.")
    return ParseResult(action=value.strip())


TAG_FRAGMENTS = ["<a>", "</a>", "<a", "a>", "</", "\\boxed{", "\\boxed", "{", "}", " ", "\n", "x"]
tagged_text = st.lists(
    st.sampled_from(TAG_FRAGMENTS) | st.text(alphabet="<>/{}\\abx \n", max_size=4), max_size=30
).map("".join)


@settings(max_examples=400, deadline=None)
@given(tagged_text)
def test_xml_tag_parser_matches_the_regex_version(text: str) -> None:
    assert xml_tag_parser("a")(text) == reference_xml_tag("a", text)
    assert xml_tag_parser("a", exactly_one=True)(text) == reference_xml_tag(
        "a", text, exactly_one=True
    )


@settings(max_examples=400, deadline=None)
@given(tagged_text)
def test_boxed_parser_matches_the_rescanning_version(text: str) -> None:
    assert boxed_parser()(text) == reference_boxed(text)


@settings(max_examples=200, deadline=None)
@given(tagged_text)
def test_tag_blocks_are_the_lazy_regex_matches(text: str) -> None:
    expected = [
        (m.start(), m.start(1), m.end(1), m.end())
        for m in re.finditer("<a>(.*?)</a>", text, re.DOTALL)
    ]
    assert list(tag_blocks(text, "<a>", "</a>")) == expected


def test_tag_blocks_refuses_empty_tags() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        list(tag_blocks("x", "", "</a>"))


MIB = 1 << 20
# A bound for 1 MiB of hostile text. The linear parsers take ~0.2 s at most; the quadratic
# versions they replace take hours (boxed: 40 s at 64 KB). Generous for a loaded 2-core box.
# CPU seconds of the parsing thread, not wall time: on a loaded 2-core CI box the wall clock
# also counts the time spent waiting for a core (a linear parse measured 3.2 s of wall time
# for 0.4 s of CPU here), while a quadratic one takes minutes of CPU at 1 MiB.
LINEAR_BOUND_S = 3.0


def one_mib(unit: str, tail: str = "") -> str:
    return unit * ((MIB - len(tail)) // len(unit)) + tail


HOSTILE_PARSES: list[tuple[str, Parser, str]] = [
    ("boxed repeated", boxed_parser(), one_mib("\\boxed{")),
    ("boxed open braces", boxed_parser(), "\\boxed{" + one_mib("{")),
    ("boxed balanced at the end", boxed_parser(), one_mib("\\boxed{", "}" * 10)),
    ("boxed nested", boxed_parser(), one_mib("\\boxed{{", "}")),
    ("xml unclosed", xml_tag_parser("move"), one_mib("<move>")),
    ("xml closed many", xml_tag_parser("move", exactly_one=True), one_mib("<move>1</move>")),
    ("xml half tags", xml_tag_parser("move"), one_mib("<move</move")),
    ("think unclosed", think_prefix_parser(), one_mib("<think>")),
    ("think spaces", think_prefix_parser(require=False), one_mib(" ", "x")),
    ("identity", identity_parser, one_mib(" \n")),
    (
        "composed",
        compose_parsers(think_prefix_parser(), xml_tag_parser("move"), boxed_parser()),
        "<think></think>" + one_mib("<move>\\boxed{"),
    ),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("name", "parse", "text"), HOSTILE_PARSES, ids=[h[0] for h in HOSTILE_PARSES]
)
def test_parsers_are_linear_on_1mib_of_hostile_text(name: str, parse: Parser, text: str) -> None:
    assert len(text) >= MIB - 16
    started = time.thread_time()
    result = parse(text)
    elapsed = time.thread_time() - started
    assert isinstance(result, ParseResult)
    assert elapsed < LINEAR_BOUND_S, f"{name}: {elapsed:.1f} CPU s for 1 MiB (quadratic?)"


def test_hostile_inputs_still_parse_correctly() -> None:
    """The big inputs above give the answers the small cases do (the scan is not skipped)."""
    assert boxed_parser()(one_mib("\\boxed{", "7}")).action == "7"
    assert boxed_parser()("\\boxed{" + one_mib("{")).action is None
    deep = "\\boxed{" + "{" * 1000 + "}" * 1000 + "}"
    assert boxed_parser()(deep).action == "{" * 1000 + "}" * 1000
    assert xml_tag_parser("move")(one_mib("<move>1</move>x", "<move>3</move>")).action == "3"
    # The first opening tag opens the block, as the regex did; the others nest in it: a failure.
    nested = xml_tag_parser("move")(one_mib("<move>", "3</move>"))
    assert nested.action is None and nested.obs is not None and "do not nest" in nested.obs
    many = xml_tag_parser("move", exactly_one=True)(one_mib("<move>1</move>"))
    assert many.obs is not None and f"Found {MIB // 14} <move> tags" in many.obs
