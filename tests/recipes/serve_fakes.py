"""`ludic serve` processes on 127.0.0.1 for the recipe tests that train against a server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

TOKEN = "many-token"


class Server:
    """`ludic serve` on a local model at a fixed free port: killed and restarted at will."""

    def __init__(self, model_dir: str, log: Path, *, token: str = TOKEN) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir, self.log, self.token = model_dir, log, token
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        command = [sys.executable, "-m", "ludic.inference.http.server", "--model", self.model_dir]
        command += ["--port", str(self.port), "--token", self.token, "--threads", "1"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        return self

    def wait(self) -> None:
        from ludic.inference.vllm.server import wait_for_health

        wait_for_health(self.url, timeout_s=120, process=self.process)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()  # no goodbye: the process is simply gone
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def served_version(self) -> int:
        return int(self.get("/ludic/version")["policy_version"])

    def get(self, path: str) -> dict[str, object]:
        """A JSON GET on the server's root with its token."""
        auth = {"Authorization": f"Bearer {self.token}"}
        reply = httpx.get(self.url + path, headers=auth, timeout=10)
        reply.raise_for_status()
        return dict(reply.json())
