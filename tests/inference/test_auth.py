"""Control-endpoint tokens: read from the flag or $LUDIC_SERVER_TOKEN, compared as bytes."""

from __future__ import annotations

import pytest

from ludic.inference.http.auth import TOKEN_ENV, resolve_token, token_matches


def test_the_flag_wins_then_the_environment_then_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert resolve_token(None) is None
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert resolve_token(None) == "from-env"
    assert resolve_token("from-flag") == "from-flag"
    monkeypatch.setenv(TOKEN_ENV, "")
    assert resolve_token(None) is None  # an empty variable is no token


@pytest.mark.parametrize("bad", ["sécret", " padded ", "two\nlines"])
def test_a_token_no_header_can_carry_is_refused_at_start(bad: str) -> None:
    with pytest.raises(ValueError, match="printable ASCII"):
        resolve_token(bad)


def test_tokens_of_any_characters_compare_without_error() -> None:
    assert token_matches("s3cret", "s3cret")
    assert not token_matches("s3cret2", "s3cret")
    assert not token_matches("tökén", "s3cret") and not token_matches("\udcff", "s3cret")
    assert not token_matches(None, "s3cret")
