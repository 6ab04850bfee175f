"""Chat-template conformance on the tiny ChatML template and a Qwen3-style thinking-stripper."""

from __future__ import annotations

import logging

import pytest

from ludic.inference.template_check import check_append_only, warn_if_not_append_only
from ludic.models import train_tiny_tokenizer

# Like Qwen3: assistant turns before the last user message lose their <think> block.
STRIPPING_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- set content = m.content %}
{%- if loop.index0 < ns.last_user and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

CONVERSATION = [
    {"role": "system", "content": "Play tic-tac-toe."},
    {"role": "user", "content": "Board: 1 2 3. Your move."},
    {"role": "assistant", "content": "<think>Centre first.</think><move>5</move>"},
    {"role": "user", "content": "Board: 1 X 3. Your move."},
    {"role": "assistant", "content": "<think>Block.</think><move>3</move>"},
    {"role": "user", "content": "You win!"},
    {"role": "assistant", "content": "Thanks."},
]


def test_tiny_template_is_append_only_with_tools() -> None:
    tok = train_tiny_tokenizer()
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}
    messages = [
        *CONVERSATION[:3],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "calc", "content": "2"},
        *CONVERSATION[3:],
    ]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    report = check_append_only(tok, messages, tools=tools)
    assert report.append_only and report.breaks == () and report.turns_checked == 3
    assert "append-only over 3" in report.summary()


def test_thinking_stripper_breaks_where_the_think_block_was() -> None:
    tok = train_tiny_tokenizer()
    tok.chat_template = STRIPPING_TEMPLATE
    report = check_append_only(tok, CONVERSATION)
    assert not report.append_only and report.turns_checked == 2
    assert [b.message_index for b in report.breaks] == [4, 6]
    first = report.breaks[0]
    assert first.expected.startswith("<think>Centre") and first.actual.startswith("<move>5")
    assert "message 4 diverges" in report.summary()


def test_needs_two_assistant_turns() -> None:
    with pytest.raises(ValueError, match="at least two assistant turns"):
        check_append_only(train_tiny_tokenizer(), CONVERSATION[:3])


def test_the_probe_warns_once_for_a_template_that_is_not_append_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tok = train_tiny_tokenizer()
    tok.chat_template = STRIPPING_TEMPLATE + "{#- probe warning test #}"  # a fresh cache key
    with caplog.at_level(logging.WARNING, logger="ludic.inference.template_check"):
        report = warn_if_not_append_only(tok)
        again = warn_if_not_append_only(tok)
    assert report is not None and not report.append_only and again is report
    (message,) = [r.getMessage() for r in caplog.records]
    assert "not append-only" in message and "num_drift_splits" in message
    assert "diverges" in message  # it names where


def test_the_probe_is_quiet_for_the_tiny_template(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ludic.inference.template_check"):
        report = warn_if_not_append_only(train_tiny_tokenizer())
    assert report is not None and report.append_only and report.turns_checked == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_probe_skips_a_tokenizer_without_a_template() -> None:
    tok = train_tiny_tokenizer()
    tok.chat_template = None
    assert warn_if_not_append_only(tok) is None


def test_the_embedded_engine_runs_the_probe_at_start(caplog: pytest.LogCaptureFixture) -> None:
    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.models import build_tiny_model

    model, tok = build_tiny_model()
    tok.chat_template = STRIPPING_TEMPLATE + "{#- engine start test #}"
    with caplog.at_level(logging.WARNING, logger="ludic.inference.template_check"):
        engine = EmbeddedEngine(model, tok)
        engine.close()
    assert any("not append-only" in r.getMessage() for r in caplog.records)
