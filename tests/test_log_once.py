"""One log-once helper for every "a bug in user code fails each call the same way" warning
(parsers, tools, external tool handlers, slow env calls): each is logged once per key, and one
`forget_warnings()` lets all of them warn again (each module used to keep its own set, which
tests had to reset one by one)."""

from __future__ import annotations

import logging

import pytest

from ludic._log_once import forget_warnings, warn_once
from ludic.agents.base import _report_parser_error
from ludic.agents.tools import _report_tool_error
from ludic.interaction.acting import _report as _report_handler_error

LOG = logging.getLogger("ludic.test_log_once")


def test_a_key_is_warned_about_once_until_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    forget_warnings()
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        logged = [warn_once(LOG, ("a",), "first %s", 1) for _ in range(3)]
        logged.append(warn_once(LOG, ("b",), "other"))
        forget_warnings()
        logged.append(warn_once(LOG, ("a",), "again"))
    assert logged == [True, False, False, True, True]
    assert [r.getMessage() for r in caplog.records] == ["first 1", "other", "again"]


def test_the_same_key_on_another_logger_is_another_warning() -> None:
    forget_warnings()
    assert warn_once(LOG, ("k",), "x")
    assert warn_once(logging.getLogger("ludic.test_log_once.other"), ("k",), "x")


def my_parser(text: str) -> None: ...


def my_handler(calls: object, ctx: object) -> None: ...


def test_one_reset_lets_parser_tool_and_handler_failures_warn_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def report_all() -> None:
        _report_parser_error(my_parser, KeyError("x"))  # type: ignore[arg-type]
        _report_tool_error("my_tool", KeyError("x"))
        _report_handler_error(my_handler, KeyError("x"))

    forget_warnings()
    with caplog.at_level(logging.WARNING, logger="ludic"):
        report_all()
        report_all()
        assert len(caplog.records) == 3  # once each, though the name and type are the same
        forget_warnings()
        report_all()
    assert len(caplog.records) == 6
