"""`ludic serve`'s run: bind the port first, then load the model, start the engine and serve
`server.create_app`'s app with uvicorn until interrupted. It defines no endpoint (`server` does).
"""

from __future__ import annotations

import errno
import logging
import socket

from ludic.errors import LudicUsageError
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.http.auth import TOKEN_ENV, resolve_token
from ludic.inference.http.read_deadlines import guard_reads
from ludic.inference.http.serve_config import ServeConfig, check_serve_config, served_name
from ludic.inference.http.server import create_app

logger = logging.getLogger(__name__)


def _authority(host: str, port: int) -> str:
    """`host:port` as a URL writes it: an IPv6 address in brackets (`[::1]:8000`), else
    `::1:8000`, which no client reads as that host and port."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (port 0: a free one, which `getsockname()` names), bound as
    uvicorn binds (SO_REUSEADDR, so a port left in TIME_WAIT by a server that just stopped still
    counts as free), for uvicorn to serve on; LudicUsageError when it cannot be bound."""
    if host.startswith("[") and host.endswith("]"):  # a URL's spelling, which bind() rejects
        raise LudicUsageError(
            f"--host {host}: give the IPv6 address without brackets (--host {host[1:-1]}); "
            "the URL the server prints brackets it"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise LudicUsageError(
                f"port {_authority(host, port)} is in use ({e.strerror}: another server?); "
                "stop it or pass another --port"
            ) from None
        raise LudicUsageError(
            f"cannot listen on {_authority(host, port)} ({e.strerror or e}); pass another --host "
            "or --port"
        ) from None
    return sock


def run_server(config: ServeConfig) -> None:
    """`server.serve`: load the model, start the engine and serve until interrupted (blocks)."""
    from ludic.models.checkpoint_step import refuse_unfinished_step
    from ludic.models.loading import check_model_directory

    check_serve_config(config)  # before the model loads
    # a missing model or a step whose save never finished is the first error, not a port in use,
    # and is refused before the port is bound (load_model would refuse it only after)
    refuse_unfinished_step(config.model, verify=config.verify)
    check_model_directory(config.model)
    # bound now (uvicorn would find a port in use only after loading the model), and kept: the
    # startup line names the port bound, which --port 0 leaves to the system
    with _listen_socket(config.host, config.port) as listening:
        _serve_on(config, listening)


def _serve_on(config: ServeConfig, listening: socket.socket) -> None:
    """Load the model and serve on the bound socket `listening` until interrupted."""
    import torch
    import uvicorn

    from ludic.recipes.inference import engine_settings  # the command line, as actor and eval

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    token = resolve_token(config.token)
    if token is None and config.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without a token: control endpoints are disabled", config.host)
    engine_config = EngineConfig(
        max_batch_size=config.max_batch_size,
        max_model_len=config.max_model_len,
        logprobs_mode=config.logprobs_mode,
        batch_invariant=config.batch_invariant,
        prepacked_gemm=config.prepacked_gemm,
    )
    engine = EmbeddedEngine.from_pretrained(
        config.model,
        dtype=config.dtype,
        device=config.device,
        config=engine_config,
        verify=config.verify,
        policy_version=config.policy_version,
    )
    name = served_name(config)  # "ludic" for a training checkpoint, whichever step
    app = create_app(
        engine,
        model_name=name,
        token=token,
        max_body_bytes=config.max_body_bytes,
        close_engine_at_signal=True,  # the requests in flight end at Ctrl-C or SIGTERM
    )
    weights = next(engine.model.parameters())
    if token is None:  # either source turns them on
        control = f"disabled (no --token or ${TOKEN_ENV})"
    else:
        control = f"need the token (from {'--token' if config.token else '$' + TOKEN_ENV})"
    port = listening.getsockname()[1]
    print(
        f"ludic serve: {config.model} as {name!r} on {weights.device} ({weights.dtype}) at "
        f"policy version {engine.policy_version}, "
        f"http://{_authority(config.host, port)}/v1; control endpoints {control}; engine: "
        f"{engine_settings(engine_config)}",
        flush=True,
    )
    timed_app, protocol = guard_reads(
        app, header_timeout_s=config.header_timeout, body_timeout_s=config.body_timeout
    )
    try:
        uvicorn.run(  # on the socket bound above (fd), at the port it holds
            timed_app,
            host=config.host,
            port=port,
            fd=listening.fileno(),
            log_level=config.log_level,
            http=protocol,  # closes connections whose request head or body does not arrive
            proxy_headers=False,  # the app applies them, inside the read bounds (guard_reads)
        )
    finally:
        engine.close()
