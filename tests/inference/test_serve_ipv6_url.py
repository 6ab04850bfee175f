"""`ludic serve --host ::1` writes its address as a URL does, `http://[::1]:PORT/v1`: the startup
line said `http://::1:PORT/v1`, which no client reads as that host and port (httpx refuses it).
The port-in-use refusal brackets the address too. End to end, a client given the printed URL
(the HTTP client `make_client` builds, on its aiohttp transport) reaches the server."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ludic.cli import EXIT_REFUSED, main
from ludic.inference.client import ChatRequest
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http import server
from ludic.inference.http.serve_config import ServeConfig
from ludic.inference.sampling import SamplingConfig
from ludic.models import tiny_model_dir
from ludic.recipes.inference import close_client, make_client

_URL = re.compile(r"(http://\[::1\]:(\d+)/v1);")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) here")


def test_the_startup_line_brackets_an_ipv6_host(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    bound: list[int] = []

    def run(app: object, **kwargs: object) -> None:
        fd = kwargs["fd"]
        assert isinstance(fd, int)
        with socket.socket(fileno=socket.dup(fd)) as listening:  # the socket uvicorn serves on
            bound.append(listening.getsockname()[1])

    monkeypatch.setattr(uvicorn, "run", run)
    server.serve(ServeConfig(model=str(tiny_model_dir()), host="::1", port=0))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ludic serve:"))
    match = _URL.search(line)
    assert match is not None, line
    assert int(match.group(2)) == bound[0]
    assert httpx.URL(match.group(1)).host == "::1"  # read back as the host it names


def test_a_port_in_use_names_the_bracketed_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", _no_load)
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(
                ["serve", "--model", str(tiny_model_dir()), "--host", "::1", "--port", str(port)],
                report_refusals=True,
            )
    assert exit_.value.code == EXIT_REFUSED
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"ludic serve: error: port [::1]:{port} is in use"), first


def test_a_bracketed_host_is_refused_naming_the_address_without(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--host [::1]` (a URL's spelling) failed as "cannot listen on [::1]:8000 (Name or service
    not known)", which reads as if ::1 could not be bound."""
    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", _no_load)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tiny_model_dir()), "--host", "[::1]"], report_refusals=True)
    assert exit_.value.code == EXIT_REFUSED
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        "ludic serve: error: --host [::1]: give the IPv6 address without brackets (--host ::1); "
        "the URL the server prints brackets it"
    ), first


def _no_load(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model loaded before the host was checked")


async def _one_reply(url: str) -> tuple[int, ...]:
    from ludic.inference.http.server_wait import wait_for_servers

    await wait_for_servers([url], within_s=180)  # listening once the model has loaded
    client = make_client(url)  # asks /v1/models which model, then a client for it
    try:
        request = ChatRequest(
            messages=[{"role": "user", "content": "hi"}],
            sampling=SamplingConfig(max_tokens=3, temperature=0.0),
        )
        response = await client.complete(request)
    finally:
        await close_client(client)
    return tuple(response.completion_token_ids)


@pytest.mark.slow
def test_a_client_given_the_printed_url_gets_a_reply(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "ludic.cli", "serve", "--model", str(tiny_model_dir())]
    command += ["--host", "::1", "--port", "0", "--threads", "1"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = _printed_url(process, log)
        assert len(asyncio.run(_one_reply(url))) > 0
    finally:
        process.terminate()
        process.wait(timeout=30)


def _printed_url(process: subprocess.Popen[bytes], log: Path) -> str:
    """The URL of the startup line, once printed (after the model loads)."""
    import time

    deadline = time.monotonic() + 180
    while (match := _URL.search(log.read_text())) is None:
        if process.poll() is not None:
            pytest.fail(f"ludic serve exited with {process.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"ludic serve printed no URL in 180 s:\n{log.read_text()}")
        time.sleep(0.2)
    return match.group(1)
