"""Waiting for a server to start serving: poll `/health` (and, given the control token, an
authenticated `/ludic/version`) until it answers, failing early if the process exits.

Works for `ludic serve` and Ludic's vLLM server alike (both serve `/health` and
`/ludic/version`). It does not start, restart or stop servers, and it does not retry requests
once the server is up.
"""

from __future__ import annotations

import subprocess
import time

import httpx

from ludic.inference.http.server_wait import PollBudget, server_root

VERSION_PATH = "/ludic/version"


class ServerExited(RuntimeError):
    """The server process being waited for exited before it served."""

    def __init__(self, returncode: int) -> None:
        super().__init__(f"server process exited with code {returncode} before serving")
        self.returncode = returncode


def wait_for_health(
    base_url: str,
    *,
    timeout_s: float = 600.0,
    process: subprocess.Popen[bytes] | None = None,
    token: str | None = None,
    poll_s: float = 0.5,
) -> None:
    """Poll until the server at `base_url` (with or without a trailing `/v1`) serves.

    Healthy means `GET /health` answers 200 and, when `token` is given, `GET /ludic/version`
    with that bearer token answers 200 too: another server already on the port answers
    `/health` but not our token. With `process`, it is healthy only while that process runs,
    and its exit raises `ServerExited` at once. Raises `TimeoutError` after `timeout_s`.
    """
    budget = PollBudget(timeout_s, poll_s)
    root = server_root(base_url)
    while True:
        if process is not None and process.poll() is not None:
            raise ServerExited(process.returncode)
        if _serves(root, token) and (process is None or process.poll() is None):
            return
        if budget.spent():
            raise TimeoutError(f"{root}/health did not report healthy within {timeout_s:.0f}s")
        time.sleep(poll_s)


def _serves(root: str, token: str | None) -> bool:
    try:
        if httpx.get(root + "/health", timeout=2.0).status_code != 200:
            return False
        if token is None:
            return True
        auth = {"Authorization": f"Bearer {token}"}
        return httpx.get(root + VERSION_PATH, headers=auth, timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


__all__ = ["ServerExited", "wait_for_health"]
