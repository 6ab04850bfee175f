"""`ludic serve`'s first line says whether its control endpoints are on and where their token
came from: --token, or $LUDIC_SERVER_TOKEN (which it reads as well; the line used to say
"disabled (no --token)" as if --token were the only way to turn them on)."""

from __future__ import annotations

import pytest

from ludic.inference.http import server
from ludic.inference.http.auth import TOKEN_ENV
from ludic.inference.http.serve_config import ServeConfig
from ludic.models import tiny_model_dir


def _first_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], token: str | None
) -> str:
    import uvicorn

    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append(app))
    server.serve(ServeConfig(model=str(tiny_model_dir()), port=0, token=token))
    assert len(served) == 1
    return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ludic serve:"))


@pytest.mark.parametrize(
    ("flag", "env", "said"),
    [
        (None, "from-env", "control endpoints need the token (from $LUDIC_SERVER_TOKEN)"),
        ("from-flag", None, "control endpoints need the token (from --token)"),
        ("from-flag", "from-env", "control endpoints need the token (from --token)"),
        (None, None, "control endpoints disabled (no --token or $LUDIC_SERVER_TOKEN)"),
    ],
)
def test_the_line_names_where_the_token_came_from(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str | None,
    env: str | None,
    said: str,
) -> None:
    if env is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, env)
    assert f"; {said}; engine: " in _first_line(monkeypatch, capsys, flag)


def test_the_environments_token_guards_the_control_endpoints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The line is true: the app is built with $LUDIC_SERVER_TOKEN as its token."""
    import uvicorn
    from fastapi.testclient import TestClient

    monkeypatch.setenv(TOKEN_ENV, "from-env")
    apps: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: apps.append(app))
    server.serve(ServeConfig(model=str(tiny_model_dir()), port=0))
    client = TestClient(apps[0])  # type: ignore[arg-type]
    assert client.get("/ludic/version").status_code == 401
    headers = {"Authorization": "Bearer from-env"}
    assert client.get("/ludic/version", headers=headers).status_code == 200
