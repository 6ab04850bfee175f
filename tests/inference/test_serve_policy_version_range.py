"""`ludic serve --policy-version` past what a sample's int64 version holds is refused in one
line before the model loads. Before: the server served it, every reply carried it, and every
sample generated from it was unreadable downstream (msgpack cannot pack an int past 2**64; the
learner refuses policy versions past 2**63-1)."""

from __future__ import annotations

import pytest

from ludic.cli import EXIT_REFUSED, main
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import tiny_model_dir


@pytest.mark.parametrize("value", [str(2**63), str(10**30)])
def test_a_policy_version_past_int64_is_one_line_naming_the_flag(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", load)
    with pytest.raises(SystemExit) as exit_:
        argv = ["serve", "--model", str(tiny_model_dir()), "--policy-version", value]
        main(argv, report_refusals=True)
    assert exit_.value.code == EXIT_REFUSED
    _, err = capsys.readouterr()
    said = f"ludic serve: error: --policy-version must be at most 2**63-1, got {value}"
    assert err.splitlines()[0] == said, err
