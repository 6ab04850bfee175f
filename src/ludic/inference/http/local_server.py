"""`LocalServer`: `ludic serve` in a child process on this machine, for process-parallel
generation.

A trainer that generates in its own process shares one interpreter (and its GIL) between
rollouts and the optimizer step; on a small model the Python work of both dominates, so a
background thread hides little. `LocalServer` starts the embedded server on a local model
directory in a child process (its own torch threads, e.g. one core each), waits until that child
answers with its token (another server already on the port never passes for it), and hands out
its URL and a fresh control token, so the trainer can generate there with
`ludic.recipes.inference.make_inference(..., server_url=server.url, server_token=server.token)`
(an HTTP client plus a `BroadcastPolicyPublisher` pushing weights after each step) and, with
`PrefetchBatchSource` and `max_lag >= 1`, train on one batch while the server generates the
next. The README's "Generation in another process" shows the loop.

It binds 127.0.0.1 only, passes the token through the environment (never on the command line,
where `ps` shows it) and stops the child (terminate, then kill) on `close()` or when the `with`
block ends. The child runs in a session of its own, so a terminal's Ctrl-C (SIGINT to the whole
foreground process group) reaches only this process, which then stops the child in its
cleanup: the server never dies under a trainer still finishing its step. If this process dies without closing it (`kill -9`, a crash in native code), the
child notices within about a second and stops itself: on POSIX (Linux, macOS) it watches its
parent pid, which changes when the parent process dies (it is re-parented), and never on the
exit of the thread that started it (unlike Linux's PR_SET_PDEATHSIG, which fires when the
forking *thread* exits). Elsewhere (Windows) an orphaned child is not stopped. It does not restart a server that dies (the next request or push fails, naming it),
manage several servers, or place the child on particular cores.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ludic.errors import Refusal
from ludic.inference.http.auth import TOKEN_ENV
from ludic.inference.http.health import ServerExited, wait_for_health

_PORT_ATTEMPTS = 3  # a free port can be taken between choosing it and the child binding it
PARENT_PID_ENV = "LUDIC_SERVE_PARENT_PID"
"""The pid of the process whose death stops the child (see `watch_parent`)."""
_ORPHAN_GRACE_S = 10.0  # after SIGTERM to itself, an orphaned child exits at once after this


class LocalServer:
    """`ludic serve --model model_dir` in a child process on 127.0.0.1.

    - `threads`: the child's torch intra-op threads (and `OMP_NUM_THREADS`); 1 leaves the other
      cores to the trainer.
    - `port`: default a free one. `token`: the control token (default: a fresh random one).
    - `served_model_name`: what `/v1/models` reports (default: the directory name; "ludic"
      for a training checkpoint, `ludic.inference.http.serve_config.served_name`).
    - `args`: further `ludic serve` options, e.g. `("--max-batch-size", "32")`.
    - `log_path`: where the child's output goes (default: a temporary file, removed on close;
      its tail is in the error when the server does not start).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        threads: int | None = 1,
        port: int | None = None,
        token: str | None = None,
        served_model_name: str | None = None,
        args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 180.0,
    ) -> None:
        from ludic.models.loading import ADAPTER_CONFIG, model_directory  # torch: not at import

        model_path = Path(model_dir)
        saved = model_directory(model_path)  # a checkpoint step folder serves its model/
        if not any((saved / name).is_file() for name in ("config.json", ADAPTER_CONFIG)):
            raise ValueError(
                f"LocalServer: {model_path} is not a model directory or checkpoint step folder "
                "(no config.json); save the policy first, e.g. "
                "ludic.models.save_model(model, tokenizer, path)"
            )
        if threads is not None and threads < 1:
            raise ValueError(f"LocalServer: threads must be >= 1 (or None), got {threads}")
        self.model_dir = model_path
        self.threads = threads
        self.token = token or secrets.token_urlsafe(24)
        self.served_model_name = served_model_name
        self.args = tuple(args)
        self.startup_timeout_s = startup_timeout_s
        self._fixed_port = port
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else _temp_log()
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's base URL (what `make_inference` and `OpenAICompatibleClient` take)."""
        if self.process is None:
            raise RuntimeError("LocalServer is not running: call start() or use `with`")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalServer:
        """Start the child and wait until it serves (`launch()` then `wait_ready()`); with no
        fixed `port`, a port taken meanwhile is retried on another. Raises RuntimeError with
        the child's log tail if it exits or does not serve within `startup_timeout_s`."""
        if self.process is not None:
            return self
        attempts = 1 if self._fixed_port else _PORT_ATTEMPTS
        for attempt in range(attempts):
            self.launch()
            try:
                return self.wait_ready()
            except _ExitedEarly as e:
                if attempt + 1 == attempts or "address already in use" not in e.log.lower():
                    raise
        raise AssertionError("unreachable")

    def launch(self) -> LocalServer:
        """Start the child without waiting (then `wait_ready()`): several servers load their
        models in parallel this way."""
        if self.process is None:
            self.port = self._fixed_port or _free_port()
            self.process = self._spawn()
        return self

    def wait_ready(self) -> LocalServer:
        """Wait until the child serves: it is running and answers `/ludic/version` with this
        server's token, so another server already on the port never passes for it. Raises
        RuntimeError with the child's log tail (and stops it) if it exits or times out."""
        if self.process is None:
            raise RuntimeError("LocalServer is not running: call launch() or start() first")
        try:
            wait_for_health(
                self.url,
                timeout_s=self.startup_timeout_s,
                process=self.process,
                token=self.token,
                poll_s=0.1,
            )
        except ServerExited as e:
            tail = self._log_tail()
            self.close()
            raise _ExitedEarly(self._exit_message(e.returncode, tail), tail) from None
        except TimeoutError:
            tail = self._log_tail()
            self.close()
            raise RuntimeError(
                f"LocalServer: `ludic serve` on {self.model_dir} did not serve on port "
                f"{self.port} within {self.startup_timeout_s:.0f} s (pass startup_timeout_s for "
                f"a large model); its output ends:\n{tail}"
            ) from None
        return self

    def _exit_message(self, code: int, tail: str) -> str:
        busy = ""
        if self._fixed_port and "address already in use" in tail.lower():
            busy = f" (port {self.port} is taken by another process: pass another port, or none)"
        return (
            f"LocalServer: `ludic serve` on {self.model_dir} exited with code {code} before "
            f"serving{busy}; its output ends:\n{tail}"
        )

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "ludic.inference.http.local_server"]
        command += ["--model", str(self.model_dir), "--port", str(self.port)]
        command += ["--host", "127.0.0.1"]
        if self.served_model_name:
            command += ["--served-model-name", self.served_model_name]
        env = {**os.environ, TOKEN_ENV: self.token, PARENT_PID_ENV: str(os.getpid())}
        if self.threads is not None:
            command += ["--threads", str(self.threads)]
            env["OMP_NUM_THREADS"] = str(self.threads)
        command += list(self.args)
        with self.log_path.open("ab") as log:
            return subprocess.Popen(  # its own session: the terminal's Ctrl-C is not for it
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after 20 s); safe to call twice."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def kill(self) -> None:
        """Kill the child at once (SIGKILL: no shutdown, as when a server dies); its log is
        kept and `start()` starts a fresh one on the same port if `port` was given."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=30)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ExitedEarly(Refusal, RuntimeError):
    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def watch_parent(poll_s: float = 0.5) -> threading.Thread | None:
    """In the child: stop this process once the process named by `PARENT_PID_ENV` is gone.

    A daemon thread polls `os.getppid()`; the parent's death re-parents this process (to init
    or a subreaper), which changes it, also when the parent died before this thread started.
    It then sends itself SIGTERM (the server shuts down and closes its engine) and exits
    outright `_ORPHAN_GRACE_S` later if still running. No-op without the variable or off POSIX.
    """
    expected = os.environ.pop(PARENT_PID_ENV, None)  # not inherited by anything it starts
    if not expected or os.name != "posix":
        return None

    def watch() -> None:
        while os.getppid() == int(expected):
            time.sleep(poll_s)
        print(
            f"ludic serve: the process that started it (pid {expected}) is gone; stopping",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_ORPHAN_GRACE_S)
        os._exit(1)

    thread = threading.Thread(target=watch, name="ludic-parent-watch", daemon=True)
    thread.start()
    return thread


def _serve_as_child() -> None:
    """`ludic serve` with `watch_parent` running first (before torch loads: a parent killed
    during the child's start still stops it)."""
    watch_parent()
    import tyro

    from ludic.inference.http.serve_config import ServeConfig
    from ludic.inference.http.server import serve

    serve(tyro.cli(ServeConfig, prog="ludic serve"))


def _temp_log() -> Path:
    handle, path = tempfile.mkstemp(prefix="ludic-serve-", suffix=".log")
    os.close(handle)
    return Path(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = ["PARENT_PID_ENV", "LocalServer", "watch_parent"]

if __name__ == "__main__":
    _serve_as_child()
