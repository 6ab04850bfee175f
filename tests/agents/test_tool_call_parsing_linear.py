"""Tool-call parsing from completion text is linear in the text and gives the same results as
the first version (a `\\s*<tool_call>(.*?)</tool_call>` regex, quadratic on a completion that
repeats an unclosed `<tool_call>` or a long run of whitespace)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.agents.tools import INVALID_TOOL, parse_tool_calls, strip_tool_calls

REFERENCE = re.compile(r"\s*<tool_call>(.*?)</tool_call>", re.DOTALL)
MIB = 1 << 20
# CPU seconds of the parsing thread (~0.2-0.4 s here; the regex took 7 s at 64 KB of spaces), not
# wall time, which on a loaded CI box also counts the wait for a core (3.2 s measured here).
LINEAR_BOUND_S = 3.0

FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool_call", '{"name": "f"}', " ", "\n", "\u2003"]
texts = st.lists(
    st.sampled_from(FRAGMENTS) | st.text(alphabet="<>/{} \t\n\x1c\x85x", max_size=4), max_size=25
).map("".join)


@settings(max_examples=400, deadline=None)
@given(texts)
def test_strip_and_parse_match_the_regex_version(text: str) -> None:
    assert strip_tool_calls(text) == REFERENCE.sub("", text).strip()
    parsed = [(call.name, call.arguments, problem) for call, problem in parse_tool_calls(text)]
    raw_blocks = REFERENCE.findall(text)
    assert len(parsed) == len(raw_blocks)
    for (name, arguments, problem), raw in zip(parsed, raw_blocks, strict=True):
        if name == INVALID_TOOL:
            assert arguments == raw.strip() and problem
        else:
            assert name == "f" and problem is None


def one_mib(unit: str, tail: str = "") -> str:
    return unit * ((MIB - len(tail)) // len(unit)) + tail


HOSTILE = {
    "unclosed": one_mib("<tool_call>"),
    "spaces": one_mib(" "),
    "many calls": one_mib(' <tool_call>{"name": "f"}</tool_call>'),
    "half tags": one_mib("<tool_call</tool_call"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_tool_call_parsing_is_linear_on_1mib(name: str) -> None:
    text = HOSTILE[name]
    started = time.thread_time()
    parse_tool_calls(text)
    strip_tool_calls(text)
    elapsed = time.thread_time() - started
    assert elapsed < LINEAR_BOUND_S, f"{name}: {elapsed:.1f} CPU s for 1 MiB (quadratic?)"


def test_hostile_text_still_parses() -> None:
    text = one_mib(" ", '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> done')
    [(call, problem)] = parse_tool_calls(text)
    assert (call.name, call.arguments, problem) == ("f", '{"x": 1}', None)
    assert strip_tool_calls(text) == "done"
    assert len(parse_tool_calls(HOSTILE["many calls"])) == MIB // 37
