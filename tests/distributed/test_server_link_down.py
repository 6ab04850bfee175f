"""A weight push to a server that is no longer running says so (and where its cause is), not
only "Connection refused": what a learner saw when vLLM's engine died under it."""

from __future__ import annotations

import socket

import pytest

from ludic.distributed.server_link import ServerLink, ServerUnreachable


def test_a_server_that_is_not_running_is_named_as_down() -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    link = ServerLink(f"http://127.0.0.1:{port}", "token")
    with pytest.raises(ServerUnreachable, match="cannot reach the server") as caught:
        link.status(timeout_s=5)
    assert "the server is not running" in str(caught.value)
    assert "its own log says why" in str(caught.value)
    link.http.close()
