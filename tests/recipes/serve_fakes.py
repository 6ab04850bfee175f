"""`ludic serve` processes on 127.0.0.1 for the recipe tests that train against a server: a
`LocalServer` on a fixed port, so a killed server restarts at the same URL."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from ludic.inference.http.local_server import LocalServer

TOKEN = "many-token"


class Server:
    """`ludic serve` on a local model at a fixed free port: killed and restarted at will."""

    def __init__(self, model_dir: str, log: Path, *, token: str = TOKEN) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.local = LocalServer(
            model_dir, threads=1, port=port, token=token, log_path=log, startup_timeout_s=120
        )
        self.url, self.token, self.model_dir, self.log = (
            f"http://127.0.0.1:{port}",
            token,
            model_dir,
            log,
        )

    def start(self) -> Server:
        """Start the child without waiting (`wait()` next), so several load at once."""
        self.local.launch()
        return self

    def wait(self) -> None:
        self.local.wait_ready()

    def kill(self) -> None:
        self.local.kill()  # no goodbye: the process is simply gone

    def stop(self) -> None:
        self.local.close()

    def served_version(self) -> int:
        return int(self.get("/ludic/version")["policy_version"])

    def get(self, path: str) -> dict[str, object]:
        """A JSON GET on the server's root with its token."""
        auth = {"Authorization": f"Bearer {self.token}"}
        reply = httpx.get(self.url + path, headers=auth, timeout=10)
        reply.raise_for_status()
        return dict(reply.json())
