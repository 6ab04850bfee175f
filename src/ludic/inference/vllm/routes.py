"""The HTTP side of the vLLM extension: the middleware (`--middleware`) that serves the
token-guarded `/ludic/*` control endpoints (version, logprobs probe, weight push) and stamps
every response with the policy version admitted. The token is $LUDIC_SERVER_TOKEN (which
`--ludic-token` sets), held to `ludic serve`'s rule: without one, or with one that is not
printable ASCII, the endpoints answer 403 as `ludic serve`'s do (a wrong token is a 401).
It drives the workers through `collective_rpc` (`ludic.inference.vllm.worker`); launching
vLLM lives in `ludic.inference.vllm.server`. As the embedded server, it refuses a push holding nan or inf
(422, in the same words; the version stays), and it tells trainers apart the same way
(`ludic.inference.http.weight_tenure`): `/init` answers with a group id that `/start`,
`/finish` and `/close` carry; another trainer's `/init` replaces the group held (one log
line) and the replaced trainer's push or close is refused (409 naming the trainer that
joined), never freeing the newer group. As the embedded server, it refuses (400) at
`/start` a push whose tensors have other shapes than the served model's (read from the
safetensors headers of its model directory: a trainer of another size), before anything is
received: loaded, such a push failed inside vLLM's reload and left the engine dead. Unlike the embedded server it cannot end a receive in
flight on a replaced group early: the workers run one `collective_rpc` at a time.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ludic.inference.http.auth import resolve_token, token_matches
from ludic.inference.http.weight_tenure import Tenure, group_in_body, group_named
from ludic.inference.vllm.logits import require_vllm

logger = logging.getLogger(__name__)
VERSION_HEADER = "X-Ludic-Policy-Version"
VLLM_TOKEN_FLAG = "--ludic-token"  # the vLLM server's flag: it sets $LUDIC_SERVER_TOKEN
_state = {"policy_version": 0}
_push: dict[str, Any] = {}  # the join / receive tasks of the weight push in progress
_tenure = Tenure()  # the held group's id and trainer, and the groups another one replaced


async def ludic_middleware(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Serves /ludic/* (token-guarded) and stamps every response with the policy version
    served when the request was admitted, as the embedded engine does: a push that lands
    while a request generates makes it look older, never newer (staleness is not
    under-counted)."""
    admitted = _state["policy_version"]
    if request.url.path.startswith("/ludic/"):
        response = await _control(request)
        admitted = _state["policy_version"]  # a control reply reports the state it leaves
    else:
        response = await call_next(request)
    response.headers[VERSION_HEADER] = str(admitted)
    return response


async def _control(request: Any) -> Any:
    from fastapi.responses import JSONResponse

    from ludic.inference.http.openai_protocol import error_body

    said = f"control endpoints are disabled: start the server with a token ({VLLM_TOKEN_FLAG} T)"
    try:
        token = resolve_token(None)  # $LUDIC_SERVER_TOKEN, held to `ludic serve`'s rule
    except ValueError as e:  # no header can carry it: as no token
        token, said = None, f"{said}; {e}"
    if token is None:  # as `ludic serve` without one: a 403, no token can match
        return JSONResponse(error_body(403, said), status_code=403)
    given = request.headers.get("authorization", "").removeprefix("Bearer ")
    if not token_matches(given, token):
        return JSONResponse(error_body(401, "missing or wrong bearer token"), status_code=401)
    handler = _ROUTES.get(request.url.path)
    if handler is None:
        return JSONResponse(error_body(404, f"unknown control endpoint {request.url.path}"), 404)
    from ludic.inference.http.weight_outcomes import WeightSyncError

    try:
        return JSONResponse(await handler(request, request.app.state.engine_client))
    except WeightSyncError as e:  # 422 (its values) or 409 (no group), as the embedded server
        return JSONResponse(error_body(e.status, str(e)), status_code=e.status)
    except (ValueError, RuntimeError) as e:
        return JSONResponse(error_body(400, f"{type(e).__name__}: {e}"), status_code=400)


async def _version(request: Any, engine: Any) -> dict[str, Any]:
    return {"policy_version": _state["policy_version"]}


async def _logprobs(request: Any, engine: Any) -> dict[str, Any]:
    """Model logprobs of `token_ids[1:]` given their prefixes, from vLLM's prompt logprobs."""
    body = await request.json()
    token_ids = body.get("token_ids") if isinstance(body, dict) else None
    if (
        not isinstance(token_ids, list)
        or len(token_ids) < 2
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in token_ids)
    ):
        raise ValueError("token_ids must be a list of at least 2 token ids (ints >= 0)")
    final = None
    request_id = f"ludic-probe-{uuid.uuid4().hex}"
    prompt = {"prompt_token_ids": token_ids}
    async for output in engine.generate(prompt, probe_sampling_params(), request_id):
        final = output
    positions = None if final is None else final.prompt_logprobs
    if positions is None or len(positions) != len(token_ids):
        raise RuntimeError("vLLM returned no prompt logprobs for the probe")
    values = [
        float(position[token].logprob)
        for position, token in zip(positions[1:], token_ids[1:], strict=True)
    ]
    # JSON has no nan or inf: those travel as strings ("nan", "-inf"), so the probe sees them.
    shown = [v if math.isfinite(v) else str(v) for v in values]
    return {"logprobs": shown, "policy_version": _state["policy_version"]}


def probe_sampling_params() -> Any:
    """One token, prompt logprobs of the given tokens only. Temperature 1 and no top-k/top-p,
    so vLLM's processed logprobs equal the model's (what the trainer computes)."""
    require_vllm()
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)


def init_request(body: object) -> Any:
    """`body` (a `/ludic/weights/init` request's JSON) as an `InitRequest`; ValueError (a 400)
    naming each bad or missing field, or saying the body is not a JSON object (a list was a
    500 traceback). Fields it does not know are ignored, as on the embedded server: a newer
    trainer may send more (`trainer` was added that way)."""
    from pydantic import ValidationError

    from ludic.inference.http.weight_join import InitRequest

    if not isinstance(body, dict):
        raise ValueError(
            f"the /ludic/weights/init body must be a JSON object (host, port, ...), got "
            f"{type(body).__name__}"
        )
    try:
        return InitRequest.model_validate(body)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'body'}: {err['msg']}"
            for err in e.errors()
        )
        raise ValueError(f"bad /ludic/weights/init body: {problems}") from None


async def _weights_init(request: Any, engine: Any) -> dict[str, Any]:
    req = init_request(await request.json())
    if req.control != "http":
        raise ValueError("the vLLM extension drives pushes over HTTP only: use control='http'")
    holder, replaced = _tenure.begin(f"{req.host}:{req.port}", req.trainer)
    if replaced is not None:
        logger.warning("%s", replaced)
    _forget_receive()
    _push["store"] = holder.store  # whose group this is (status, /start)
    # The join completes only once the trainer builds its side: do not wait for it here.
    _push["join"] = asyncio.ensure_future(
        engine.collective_rpc("ludic_weights_init", args=(req.model_dump(),))
    )
    # A trainer that says who it is carries the id back (an older one gets the old reply).
    return {"status": "joining", **({} if req.trainer is None else {"group": holder.group})}


async def _group(request: Any) -> str | None:
    """The group id a request's JSON body carries (None: an older trainer, or no body);
    ValueError (a 400) for a body that is not a JSON object, which must not pass for "no
    group": read so, `[]` or `null` closed the group held."""
    return group_in_body(await request.body(), request.url.path)


def _forget_receive() -> None:
    """A new group replaces the old one, and with it any push of the old group that never
    reached /finish (its broadcast broke: the trainer retries over a fresh group, or a new
    trainer took over): else /start refuses every later push as 'already in progress'. The
    worker's receive fails once the old group's trainer is gone; its error is logged."""
    receive = _push.pop("receive", None)
    _push.pop("verified", None)
    if receive is not None:
        receive.add_done_callback(_log_forgotten)


def _log_forgotten(receive: asyncio.Future[Any]) -> None:
    if not receive.cancelled() and receive.exception() is not None:
        logger.warning("a weight push of the previous group failed: %s", receive.exception())


async def _weights_start(request: Any, engine: Any) -> dict[str, Any]:
    from ludic.distributed.manifest import WeightManifest

    body = await request.json()
    manifest = WeightManifest.from_json(body)  # ManifestError is a ValueError -> 400
    _tenure.check(group_named(body.get("group"), "/ludic/weights/start"))  # 409: not ours
    check_push_shapes(manifest, getattr(getattr(engine, "model_config", None), "model", None))
    if _push.get("receive") is not None:
        raise RuntimeError("a push is already in progress: finish it first")
    from ludic.inference.http.weight_outcomes import WeightSyncError  # 409: the trainer rejoins

    join = _push.get("join")
    if join is None:
        raise WeightSyncError("no communicator: POST /ludic/weights/init first")
    held, sender = _push.get("store"), body.get("store")
    if sender is not None and held is not None and sender != held:  # another trainer's push
        raise WeightSyncError(
            f"no communicator for the trainer at {sender}: this server is in another "
            f"trainer's weight-sync group now (store at {held}); POST /ludic/weights/init "
            "to rejoin"
        )
    await join
    _push["version"] = manifest.version
    _push["verified"] = manifest.checksums  # False (unverified): no held totals asked
    _push["receive"] = asyncio.ensure_future(
        engine.collective_rpc("ludic_weights_receive", args=(body,))
    )
    return {"status": "receiving"}


async def _weights_finish(request: Any, engine: Any) -> dict[str, Any]:
    _tenure.check(await _group(request))  # 409: the push of a group another one replaced
    receive = _push.pop("receive", None)
    if receive is None:
        raise RuntimeError("no push in progress: POST /ludic/weights/start first")
    received = await receive  # one report per worker (TP rank)
    refuse_nonfinite(received)  # the version stays: the push is not served as new weights
    _state["policy_version"] = int(_push["version"])  # the new weights serve from now on
    await reset_prefix_cache(engine)  # cached KV came from the old weights
    reply = {"policy_version": _state["policy_version"], "num_tensors": _count(received[0])}
    if not _push.pop("verified", True):  # an unverified push: no pass over the weights
        return reply
    reports = await engine.collective_rpc("ludic_weights_held")
    return {
        **reply,
        "held_totals": [report["held"] for report in reports],  # one per worker (TP rank)
        "opaque": sorted({name for report in reports for name in report.get("opaque", [])}),
        "packed_modules_mapping": reports[0]["packed"],
    }


def check_push_shapes(manifest: Any, model: str | None) -> None:
    """ManifestError (a 400) if a pushed tensor has another shape than the same tensor of the
    checkpoint vLLM serves (`model`, its --model): vLLM's reload would fail on it halfway, its
    layers left unloaded, and the engine die at the next request. Only names the checkpoint
    holds are compared (a tied lm_head may be absent from it); a model that is not a local
    directory of safetensors files (a hub id) is not checked."""
    from ludic.distributed.manifest import ManifestError, check_dtype_kinds

    shapes = checkpoint_shapes(model) if model else None
    if not shapes:
        return
    wrong = [
        f"{e.name}: sent {tuple(e.shape)}, served {shapes[e.name]}"
        for e in manifest.tensors
        if e.name in shapes and shapes[e.name] != tuple(e.shape)
    ]
    if wrong:
        raise ManifestError(
            f"refused weight manifest: {len(wrong)} shape mismatches with the model this vLLM "
            f"serves ({model}), e.g. {wrong[:3]}; nothing was loaded. Start the trainer from "
            "the model the server loaded (`ludic train --model DIR` or `ludic learner "
            "--model DIR` with the DIR given to `python -m ludic.inference.vllm.server DIR`)"
        )
    try:  # the kinds, not the widths: vLLM may serve an fp32 checkpoint in bf16
        check_dtype_kinds(manifest, checkpoint_dtypes(model) or {})
    except ManifestError as e:
        raise ManifestError(f"refused weight manifest ({model}): {e}; nothing was loaded") from e


# safetensors' dtype names, as its headers write them, and torch's
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


@functools.lru_cache(maxsize=4)
def checkpoint_dtypes(model: str) -> dict[str, Any] | None:
    """Each tensor's torch dtype in the safetensors files of the local model directory `model`,
    read from their headers (no weights loaded; dtypes not listed above are left out); None if
    it holds none."""
    directory = Path(model)
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        return None
    import torch
    from safetensors import safe_open

    dtypes: dict[str, Any] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                dtype = _SAFETENSORS_DTYPES.get(weights.get_slice(name).get_dtype())
                if dtype is not None:
                    dtypes[name] = getattr(torch, dtype)
    return dtypes


@functools.lru_cache(maxsize=4)
def checkpoint_shapes(model: str) -> dict[str, tuple[int, ...]] | None:
    """Each tensor's shape in the safetensors files of the local model directory `model`, read
    from their headers (no weights loaded); None if it holds none (a hub id, .bin weights)."""
    directory = Path(model)
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                shapes[name] = tuple(weights.get_slice(name).get_shape())
    return shapes


def refuse_nonfinite(received: list[Any]) -> None:
    """Raise a 422 `WeightSyncError` (the embedded server's words) if a worker's report of a
    push names tensors holding nan or inf; they were loaded (vLLM receives in place)."""
    from ludic.inference.http.weight_outcomes import WeightSyncError, nonfinite_refusal

    bad = sorted({n for r in received if isinstance(r, dict) for n in r.get("nonfinite", [])})
    if bad:
        _push.pop("verified", None)
        message = nonfinite_refusal(bad, landed_in_place=True)
        logger.error("%s", message)
        raise WeightSyncError(message, status=422)


def _count(report: Any) -> int:
    """The number of tensors a worker received (an older worker reports only the count)."""
    return int(report["num_tensors"] if isinstance(report, dict) else report)


async def reset_prefix_cache(engine: Any, timeout_s: float = 60.0, poll_s: float = 0.05) -> None:
    """Drop vLLM's prefix cache, including blocks held by running requests where vLLM can
    (`reset_running_requests`, which preempts them). vLLM refuses a reset (returns False) while
    running requests hold blocks otherwise: that is retried until they finish, then an error, so
    KV computed with the old weights is never served silently after a push."""
    accepted = inspect.signature(engine.reset_prefix_cache).parameters
    kwargs = {"reset_running_requests": True} if "reset_running_requests" in accepted else {}
    deadline = time.monotonic() + timeout_s
    while await engine.reset_prefix_cache(**kwargs) is False:  # older vLLM returns None
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"vLLM refused to reset its prefix cache for {timeout_s:.0f}s (running requests "
                "hold cached blocks); the new weights are loaded and served, but cached KV "
                "from the old ones may be reused: retry the push once generation is idle"
            )
        await asyncio.sleep(poll_s)


async def _weights_close(request: Any, engine: Any) -> dict[str, Any]:
    group, held = await _group(request), _tenure.current
    if group is not None and (held is None or held.group != group):
        if held is None and _tenure.replaced_by(group) is None:
            return {"status": "closed"}  # already left: nothing to free
        _tenure.check(group)  # raises (409), naming who holds the server now
    await engine.collective_rpc("ludic_weights_close")
    _push.clear()
    _tenure.end()
    return {"status": "closed"}


async def _weights_status(request: Any, engine: Any) -> dict[str, Any]:
    join = _push.get("join")
    return {
        **_tenure.report(request.query_params.get("group")),
        "connected": join is not None and join.done() and join.exception() is None,
        "joining": join is not None and not join.done(),
        "in_progress": _push.get("receive") is not None,
        "last_version": _state["policy_version"],
        "controls": ["http"],
        "store": _push.get("store"),  # the trainer store of the group held
        "dtype": served_dtype(engine),
        "pieces": True,  # the workers receive buckets in several broadcasts (`piece_bytes`)
    }


def served_dtype(engine: Any) -> str | None:
    """The dtype vLLM serves in ("bfloat16", ...), from the engine client's model config:
    the publisher's probe tolerance follows it (`ludic.distributed.verification.PROBE_ATOL`)."""
    dtype = getattr(getattr(engine, "model_config", None), "dtype", None)
    return None if dtype is None else str(dtype).removeprefix("torch.")


_ROUTES: dict[str, Callable[[Any, Any], Awaitable[dict[str, Any]]]] = {
    "/ludic/version": _version,
    "/ludic/logprobs": _logprobs,
    "/ludic/weights/init": _weights_init,
    "/ludic/weights/start": _weights_start,
    "/ludic/weights/finish": _weights_finish,
    "/ludic/weights/close": _weights_close,
    "/ludic/weights/status": _weights_status,
}
