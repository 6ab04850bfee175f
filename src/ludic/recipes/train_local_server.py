"""`ludic train --local-server`: generation in a `ludic serve` child process, overlapped with
training.

`trainer_max_lag` checks the flags that go with it and gives the Trainer's staleness limit;
`local_server` saves the starting weights to `OUT_DIR/local_server_model` (in the run
directory, not a temporary one: a trainer killed with `kill -9` cannot remove it, and the next
run in that directory replaces it; `ludic train` holds the directory's lock meanwhile,
`ludic.recipes.run_lock`), starts `LocalServer` on them (its log in the run directory), and stops it and removes the copy when the run ends, also on an exception, Ctrl-C
or SIGTERM; `served_version` asks it which policy version it serves. The loop itself
(`PrefetchBatchSource`, the verified `BroadcastPolicyPublisher`) is wired in
`ludic.recipes.train`. It does not restart a server that dies (the next push fails, naming it),
nor run on a GPU (start `ludic serve --device cuda:1` or vLLM yourself and pass --server-url).
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from ludic.inference.embedded.engine_config import model_context
from ludic.inference.http.local_server import LocalServer
from ludic.recipes.configs import TrainConfig

__all__ = [
    "LOCAL_SERVER_LOG",
    "LOCAL_SERVER_MODEL",
    "check_local_server_context",
    "local_server",
    "local_server_args",
    "served_version",
    "trainer_max_lag",
]

LOCAL_SERVER_LOG = "local_server.log"
"""The child server's output, in the run directory."""
LOCAL_SERVER_MODEL = "local_server_model"
"""The copy of the starting weights the child server loads, in the run directory (removed when
the run ends; one a killed run left is replaced by the next run)."""


def trainer_max_lag(cfg: TrainConfig) -> int:
    """The Trainer's `max_lag`: --max-lag, else 0 (1 with --local-server). Raises ValueError
    naming the flags for a combination `ludic train` cannot run, and `RunDirInUseError` when
    another --local-server run holds OUT_DIR."""
    if cfg.max_lag is not None and cfg.max_lag < 0:
        raise ValueError(f"--max-lag must be >= 0, got {cfg.max_lag}")
    if not cfg.local_server:
        return 0 if cfg.max_lag is None else cfg.max_lag
    _check_local_server_flags(cfg)
    if cfg.max_lag == 0:
        raise ValueError(
            "--local-server generates the next batch while the trainer takes its optimizer "
            "step, so every batch after the first is one policy version old and --max-lag 0 "
            "would drop all of them; leave --max-lag out (1) or drop --local-server to train "
            "on-policy"
        )
    return 1 if cfg.max_lag is None else cfg.max_lag


def _check_local_server_flags(cfg: TrainConfig) -> None:
    if cfg.server_url:
        raise ValueError(
            "--local-server starts its own server; drop --server-url (or drop --local-server "
            "to generate on the servers you name)"
        )
    if cfg.batch_invariant:
        raise ValueError(
            "--local-server overlaps generation with training, so which policy version samples "
            "an episode depends on timing and the run cannot be bit-reproducible; drop "
            "--batch-invariant or --local-server"
        )
    if cfg.device != "cpu":
        raise ValueError(
            f"--local-server runs on the CPU, and --device is {cfg.device!r}; on GPUs start "
            "`ludic serve --model DIR --device cuda:1 --token SECRET` (or vLLM) yourself and "
            "pass --server-url URL --server-token SECRET"
        )
    if cfg.local_server_threads < 1:
        raise ValueError(f"--local-server-threads must be >= 1, got {cfg.local_server_threads}")


def check_local_server_context(cfg: TrainConfig, model: Any) -> None:
    """Refuse a --max-tokens at or past the context the child server gives `model` (its
    max_position_embeddings, as `ludic serve` without --max-model-len): every request would be
    a 400. Before the weights are saved and the server started, naming the flag the user can
    change; the server's own refusal named its URL and `ludic serve --max-model-len`, which
    --local-server does not take (nor could it raise the model's limit)."""
    context = model_context(model)
    if cfg.max_tokens >= context:
        raise ValueError(
            f"--max-tokens {cfg.max_tokens} leaves no room for a prompt: --local-server serves "
            f"the model with its context of {context} tokens (max_position_embeddings in its "
            f"config; prompt and completion together), so every request would be refused; pass "
            f"--max-tokens below {context} (the prompt's tokens count too)"
        )


def local_server_args(cfg: TrainConfig) -> tuple[str, ...]:
    """The engine flags of `ludic train` that the `ludic serve` child takes over."""
    return ("--prepacked-gemm",) if cfg.prepacked_gemm else ()


@contextmanager
def local_server(
    cfg: TrainConfig, model: Any, tokenizer: Any, console: Console
) -> Iterator[LocalServer]:
    """`ludic serve` in a child process on `model`'s current weights, stopped on exit (an
    exception, Ctrl-C and SIGTERM included). The caller holds the run directory's lock
    (`ludic.recipes.run_lock`), so no other run touches the weights copy meanwhile. A
    --max-tokens the model's context cannot hold is refused first (`check_local_server_context`)."""
    check_local_server_context(cfg, model)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    copy = cfg.out_dir / LOCAL_SERVER_MODEL
    with _serving(cfg, model, tokenizer, console, copy) as server:
        yield server


@contextmanager
def _serving(
    cfg: TrainConfig, model: Any, tokenizer: Any, console: Console, copy: Path
) -> Iterator[LocalServer]:
    from transformers.utils import logging as hf_logging

    from ludic.models import save_model

    shutil.rmtree(copy, ignore_errors=True)  # one a killed run left (this run holds the lock)
    try:
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a "Writing model shards" bar for a temporary copy
        try:
            save_model(model, tokenizer, copy)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        server = LocalServer(
            copy,
            threads=cfg.local_server_threads,
            served_model_name="policy",
            log_path=cfg.out_dir / LOCAL_SERVER_LOG,
            args=local_server_args(cfg),
        )
        with _sigterm_as_interrupt(), server:
            assert server.process is not None
            console.print(
                f"local server: `ludic serve` pid {server.process.pid} on {server.url} (log: "
                f"{server.log_path}) generates the next batch while this process trains"
            )
            yield server
    finally:  # the server has stopped: its weights copy goes
        shutil.rmtree(copy, ignore_errors=True)


def served_version(server: LocalServer) -> int | None:
    """The policy version `server` reports (None if it does not answer)."""
    import httpx

    try:
        reply = httpx.get(
            server.url + "/ludic/version",
            headers={"Authorization": f"Bearer {server.token}"},
            timeout=30,
        )
        reply.raise_for_status()
        return int(reply.json()["policy_version"])
    except (httpx.HTTPError, KeyError, ValueError, RuntimeError):
        return None


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so the `with` blocks that stop the
    server run; Python's default for SIGTERM exits without them. A handler already set (the
    `ludic` command's, which reports SIGTERM with exit code 143) is kept."""
    default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if threading.current_thread() is not threading.main_thread() or not default:
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
