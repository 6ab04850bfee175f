"""A server group whose later server does not offer the trainer's control is refused before
any server is asked to join: an earlier server sent /init would wait for a group that never
forms."""

from __future__ import annotations

import httpx
import pytest

from ludic.distributed.server_group import ServerGroup
from ludic.distributed.server_link import ControlNotOffered, ServerLink


def server(url: str, controls: list[str], sent: list[str]) -> ServerLink:
    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.url.host} {request.method} {request.url.path}")
        if request.url.path == "/ludic/weights/status":
            return httpx.Response(200, json={"controls": controls, "connected": False})
        return httpx.Response(200, json={"status": "joining"})

    return ServerLink(
        url, "token", http=httpx.Client(base_url=url, transport=httpx.MockTransport(answer))
    )


def test_a_later_server_without_the_control_is_refused_before_any_join() -> None:
    sent: list[str] = []
    servers = [
        server("http://ludic-serve:8000", ["http", "store"], sent),
        server("http://vllm:8000", ["http"], sent),
    ]
    group = ServerGroup(
        servers,
        backend="gloo",
        master_addr="127.0.0.1",
        timeout_s=5.0,
        control="store",
        min_servers=2,
    )
    with pytest.raises(ControlNotOffered, match=r"server http://vllm:8000 drives weight pushes"):
        group.connect()
    assert sent == [
        "ludic-serve GET /ludic/weights/status",
        "vllm GET /ludic/weights/status",
    ]  # statuses only: nobody was sent /init
    assert group.group is None
