"""`ludic serve` refuses a --port outside 0..65535 (0: any free port, as tests use) and a --max-body-bytes below 1 as one
`ludic serve: error:` line naming the flag, before the model loads. A --port of 70000 printed
a traceback (`OverflowError: bind(): port must be 0-65535` from the port-in-use probe), and
--max-body-bytes 0 was refused naming `max_body_bytes`, a name no flag has."""

from __future__ import annotations

import pytest

from ludic.cli import EXIT_REFUSED, main
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import tiny_model_dir


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--port", "70000", "--port must be in 0..65535, got 70000"),
        ("--port", "-1", "--port must be in 0..65535, got -1"),
        ("--port", "65536", "--port must be in 0..65535, got 65536"),
        ("--max-body-bytes", "0", "--max-body-bytes must be >= 1, got 0"),
    ],
)
def test_a_flag_out_of_range_is_one_line_naming_it(
    flag: str,
    value: str,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", load)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tiny_model_dir()), flag, value], report_refusals=True)
    assert exit_.value.code == EXIT_REFUSED
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.splitlines()[0] == f"ludic serve: error: {said}", err
