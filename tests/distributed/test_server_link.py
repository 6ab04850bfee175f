"""ServerLink takes a server's root URL or its OpenAI base URL (`.../v1`), as the clients do."""

from __future__ import annotations

import pytest

from ludic.distributed.server_link import ServerLink


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"]
)
def test_control_requests_go_to_the_server_root_whatever_url_form(url: str) -> None:
    link = ServerLink(url, "token")
    try:
        assert link.url == "http://127.0.0.1:8000"
        request = link.http.build_request("GET", "/ludic/weights/status")
        assert str(request.url) == "http://127.0.0.1:8000/ludic/weights/status"
    finally:
        link.http.close()
