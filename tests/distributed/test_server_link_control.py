"""A server that does not offer the control a trainer asks for (`BroadcastPolicyPublisher(
control="store")` against vLLM's extension, which offers "http" only; or, with "auto", a server
offering neither, of another Ludic version) is a refusal naming the server, what it offers and
the fix, raised before the server is asked to join: not a plain WeightPushError traceback."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ludic.distributed import BroadcastPolicyPublisher
from ludic.distributed.server_link import ControlNotOffered, ServerLink, WeightPushError
from ludic.errors import is_refusal
from ludic.models import build_tiny_model

URL = "http://server0:8000"


def link_offering(controls: list[str], sent: list[str]) -> httpx.Client:
    """A client whose server lists `controls` in its weight-sync status (as `ludic serve` and
    the vLLM extension do) and answers any other request with 200; `sent` gets each request."""

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        if request.url.path == "/ludic/weights/status":
            return httpx.Response(200, json={"controls": controls, "connected": False})
        return httpx.Response(200, json={"status": "joining"})

    return httpx.Client(base_url=URL, transport=httpx.MockTransport(answer))


def join(link: ServerLink, control: Any, offered: list[str]) -> None:
    link.join(
        host="127.0.0.1",
        port=29500,
        backend="gloo",
        world_size=2,
        first_rank=1,
        timeout_s=5.0,
        control=control,
        offered=offered,
    )


def test_asking_vllm_for_store_control_is_refused_before_the_join() -> None:
    sent: list[str] = []
    link = ServerLink(URL, "token", http=link_offering(["http"], sent))
    with pytest.raises(ControlNotOffered) as caught:
        join(link, "store", ["http"])
    error = caught.value
    assert isinstance(error, WeightPushError) and is_refusal(error)
    assert str(error).startswith(
        f"server {URL} drives weight pushes by control ['http'] only, not 'store' "
        "(BroadcastPolicyPublisher(control='store'))"
    )
    assert "Pass control='auto'" in str(error)  # the fix
    assert sent == []  # never asked to join


def test_auto_refuses_a_server_offering_no_control_this_trainer_drives() -> None:
    link = ServerLink(URL, "token", http=link_offering(["grpc"], []))
    with pytest.raises(ControlNotOffered, match=r"control \['grpc'\] only, none of which") as e:
        join(link, "auto", ["grpc"])
    assert "Install the same Ludic version on the trainer and the server" in str(e.value)


@pytest.mark.parametrize(
    ("control", "offered", "chosen"),
    [
        ("auto", ["http", "store"], "store"),  # `ludic serve`
        ("auto", ["http"], "http"),  # the vLLM extension
        ("auto", ["store"], "store"),
        ("http", ["http", "store"], "http"),
        ("store", ["http", "store"], "store"),
    ],
)
def test_an_offered_control_is_joined_with(control: str, offered: list[str], chosen: str) -> None:
    sent: list[str] = []
    link = ServerLink(URL, "token", http=link_offering(offered, sent))
    join(link, control, offered)
    assert link.control == chosen and sent == ["POST /ludic/weights/init"]


def test_the_publisher_refuses_before_any_server_is_asked_to_join() -> None:
    """Through `BroadcastPolicyPublisher.publish`, as `ludic train` and the learner push."""
    sent: list[str] = []
    model, _ = build_tiny_model(seed=0)
    publisher = BroadcastPolicyPublisher(
        URL, "token", control="store", http=link_offering(["http"], sent)
    )
    with pytest.raises(ControlNotOffered, match=rf"^server {URL} drives weight pushes"):
        publisher.publish(model, version=1)
    assert sent == ["GET /ludic/weights/status"]
