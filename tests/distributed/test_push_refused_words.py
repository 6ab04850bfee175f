"""What a trainer is told when a server refuses a weight-sync request in a way that is not a
plain refusal: another trainer replaced this one (`TrainerReplaced`), or the server left the
group (`ServerLeftGroup`, then rejoined and retried). Those errors carry the server's own
words, not `PushRefused`'s advice ("a refusal is not retried"), and name the server once.
Also the token advice of a 401 / 403, for `ludic serve` and the vLLM extension alike. Scripted
HTTP replies (httpx.MockTransport)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ludic.distributed import PushRefused, TrainerReplaced
from ludic.distributed.server_group import ServerGroup, ServerLeftGroup
from ludic.distributed.server_link import REPLACED, ServerLink
from ludic.inference.http.openai_protocol import error_body

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(60)]

URL = "http://s0"
NOT_RETRIED = "A refusal is not retried"
WHO = (
    f"this trainer's weight-sync group was {REPLACED}: trainer x (host h, pid 7) joined this "
    "server at 2026-01-01 00:00:00 UTC and serves its pushes now (not this trainer's weights)"
)


def _group(start: tuple[int, str]) -> ServerGroup:
    """A group of one server at URL that answers `POST /ludic/weights/start` with `start`
    (status, its words) and its status with a joined group."""
    status, said = start

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/ludic/weights/start":
            return httpx.Response(status, json=error_body(status, said))
        return httpx.Response(200, json={"connected": True})

    http = httpx.Client(base_url=URL, transport=httpx.MockTransport(answer))
    server = ServerLink(URL, "token", http=http)
    group = ServerGroup(
        [server],
        backend="gloo",
        master_addr="127.0.0.1",
        timeout_s=5,
        control="http",
        min_servers=1,
    )
    group.members = [server]  # joined (what `connect` would have done)
    return group


def _start(group: ServerGroup) -> None:
    manifest: Any = SimpleNamespace(to_json=dict)
    group._start(group.members[0], manifest)


def test_a_replaced_trainer_is_told_who_replaced_it_without_a_refusals_advice() -> None:
    with pytest.raises(TrainerReplaced) as caught:
        _start(_group((409, WHO)))
    assert str(caught.value) == f"server {URL}: {WHO}"  # named once, in the server's words
    assert NOT_RETRIED not in str(caught.value)


def test_a_server_that_left_the_group_is_named_once_without_a_refusals_advice() -> None:
    said = "no communicator: POST /ludic/weights/init first"
    with pytest.raises(ServerLeftGroup) as caught:  # the publisher rejoins and retries it
        _start(_group((409, said)))
    message = str(caught.value)
    assert message.startswith(f"server {URL}: POST /ludic/weights/start refused (409): {said} ")
    assert message.count(f"server {URL}") == 1 and NOT_RETRIED not in message
    assert "it is no longer in this trainer's weight-sync group" in message


def test_any_other_refusal_of_start_keeps_its_advice() -> None:
    with pytest.raises(PushRefused) as caught:
        _start(_group((409, "a push is already in progress: finish it first")))
    assert NOT_RETRIED in str(caught.value)


def _refusal(status: int, said: str) -> str:
    answer = httpx.MockTransport(lambda _: httpx.Response(status, json=error_body(status, said)))
    server = ServerLink(URL, "token", http=httpx.Client(base_url=URL, transport=answer))
    with pytest.raises(PushRefused) as caught:
        server.status()
    return str(caught.value)


def test_a_wrong_token_names_how_ludic_serve_and_vllm_take_theirs() -> None:
    message = _refusal(401, "missing or wrong bearer token")
    assert "`ludic serve --token T`" in message and "--ludic-token T`" in message
    assert "python -m ludic.inference.vllm.server" in message
    assert "`ludic train --server-token`" in message and "`ludic learner --token`" in message


def test_a_server_without_a_token_names_how_to_start_either_with_one() -> None:
    message = _refusal(403, "control endpoints are disabled: start the server with a token")
    assert "restart it with one" in message
    assert "`ludic serve --token T`" in message and "--ludic-token T`" in message
