"""`make_inference(..., wait_s=S)` (and `InferenceArgs.make`): a Python program that starts its
server just before (`ludic serve ... &`) waits for it to listen, as the `ludic` commands do,
also when called inside the event loop that will use it; nothing listening once the wait is
over is named, with the `server_url=` argument (not the command's flag). The waiting lines go
to stderr, shown in a script without logging configured. Without `wait_s` it does not wait (as
before). What needs no server (the control token, a bad `wait_s`) is refused before any
wait."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest

from app_server import serving_app, tiny_app, until
from ludic.inference import ChatRequest, SamplingConfig
from ludic.models import build_tiny_model
from ludic.recipes.inference import InferenceArgs, make_inference

pytestmark = pytest.mark.timeout(120)
TOKEN = "wait-token"
WAITING = "waiting for the inference server at"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_inference_made_in_its_event_loop_waits_for_a_server_still_loading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The port is bound but not listening (connections refused) until the wait has said so,
    on stderr (no logging is configured here); then `ludic serve`'s app listens on it, and the
    client made after the wait generates."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    model, tokenizer = build_tiny_model(seed=0)
    made: list[Any] = []

    async def program() -> None:  # make_inference inside the loop that uses it, as documented
        args = InferenceArgs(server_url=(url + "/v1",), server_token=TOKEN)
        inference = args.make(model, tokenizer, wait_s=100)
        try:
            request = ChatRequest(
                messages=[{"role": "user", "content": "hi"}],
                sampling=SamplingConfig(max_tokens=2, seed=0),
            )
            made.append(await inference.client.complete(request))
        finally:
            await inference.aclose()

    def run() -> None:
        try:
            asyncio.run(program())
        except BaseException as e:
            made.append(e)

    err: list[str] = []

    def said() -> str:
        err.append(capsys.readouterr().err)
        return "".join(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    until(lambda: WAITING in said() or not thread.is_alive(), "the wait", timeout=60)
    assert thread.is_alive(), f"made without waiting: {made}"
    with tiny_app(token=TOKEN) as app, serving_app(app, sock):
        thread.join(timeout=100)
    assert not thread.is_alive()
    assert len(made) == 1 and not isinstance(made[0], BaseException), made
    assert len(made[0].completion_token_ids) >= 1
    assert f"{WAITING} {url} to listen" in said()


def test_nothing_listening_after_the_wait_is_named_with_the_python_argument(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, tokenizer = build_tiny_model(seed=0)
    base = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=rf"^nothing listens at {base} after 1s \(Connect") as e:
        make_inference(model, tokenizer, server_url=base, server_token=TOKEN, wait_s=1)
    assert str(e.value).endswith("or check server_url=") and "--server-url" not in str(e.value)
    # said at once, on stderr: the first try failed and the next (0.5 s on) is within 1 s
    assert f"{WAITING} {base} to listen (0s so far, up to 1s)" in capsys.readouterr().err


def test_without_wait_s_a_server_not_listening_is_refused_at_once() -> None:
    model, tokenizer = build_tiny_model(seed=0)
    base = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=rf"^could not ask {base}/v1/models which model"):
        make_inference(model, tokenizer, server_url=base, server_token=TOKEN)


def test_what_needs_no_server_is_refused_before_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait of 100 s on a port nothing listens on would outlast the test's timeout."""
    monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    model, tokenizer = build_tiny_model(seed=0)
    base = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match="needs its control token"):
        make_inference(model, tokenizer, server_url=base, wait_s=100)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match=r"^wait_s must be >= 0 seconds"):
            make_inference(model, tokenizer, server_url=base, server_token=TOKEN, wait_s=bad)
