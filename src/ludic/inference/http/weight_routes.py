"""The HTTP face of `WeightSyncReceiver`: bearer-token routes under `/ludic/weights` (init,
start, finish, status) and `install_weight_sync_routes`, which mounts them on a FastAPI app
serving an engine. The receiving itself (group, buckets, checksums) is `weight_receiver`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import torch
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ludic.distributed.live_state import LiveStateDict
from ludic.distributed.manifest import ManifestError, WeightManifest
from ludic.distributed.push_backend import device_identity
from ludic.inference.http.auth import token_matches
from ludic.inference.http.json_body import MIN_JSON_VALUES, JSONBound, json_route_class
from ludic.inference.http.weight_outcomes import SyncResult, WeightSyncError
from ludic.inference.http.weight_receiver import (
    InitRequest,
    InPlaceLoadFn,
    LoadFn,
    WeightSyncReceiver,
)
from ludic.inference.http.weight_tenure import group_in_body, group_named
from ludic.inference.weights import pack_parameters_


def weight_sync_router(
    receiver: WeightSyncReceiver, token: str | None, *, tensors: int | None = None
) -> APIRouter:
    """The `/ludic/weights/*` routes over `receiver`, guarded by the bearer `token`; with the
    model's count of `tensors`, their JSON bodies are bounded to what its manifest needs
    (`json_body`: FastAPI parses a body before the token is checked)."""
    bearer = HTTPBearer(auto_error=False)

    def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is None:
            raise HTTPException(403, "weight sync is disabled: start the server with a token")
        if credentials is None or not token_matches(credentials.credentials, token):
            raise HTTPException(401, "missing or wrong bearer token for a control endpoint")

    route_class = APIRoute if tensors is None else json_route_class(_manifest_bound(tensors))
    router = APIRouter(
        prefix="/ludic/weights", dependencies=[Depends(require_token)], route_class=route_class
    )

    @router.post("/init")
    async def init(req: InitRequest) -> dict[str, str]:
        group = await _call(receiver.init, req)  # may end a receive in flight: off the loop
        # A trainer that says who it is carries the id back (an older one gets the old reply).
        return {"status": "joining", **({} if req.trainer is None else {"group": group})}

    @router.post("/start")
    async def start(body: dict[str, Any]) -> dict[str, str]:
        try:
            manifest = WeightManifest.from_json(body)
        except ManifestError as e:
            raise HTTPException(400, str(e)) from e
        store = body.get("store")  # the sender's group (absent from older trainers)
        group = _bad_request(group_named, body.get("group"), "/ludic/weights/start")
        await _call(receiver.start, manifest, _text(store), group)
        return {"status": "receiving"}

    @router.post("/finish")
    async def finish(request: Request) -> dict[str, Any]:
        group = await _group(request, "/ludic/weights/finish")
        result: SyncResult = await _call(receiver.finish, group)
        return result.to_dict()

    @router.post("/close")
    async def close(request: Request) -> dict[str, str]:
        group = await _group(request, "/ludic/weights/close")
        await _call(receiver.close, group)  # waits for a store-driven listener to stop
        return {"status": "closed"}

    served_on = device_identity(receiver.device)  # lets a CUDA trainer pick NCCL or gloo

    @router.get("/status")
    async def status(group: str | None = None) -> dict[str, Any]:
        return {**receiver.status(group), **served_on}

    return router


def install_weight_sync_routes(
    app: FastAPI, engine: Any, token: str | None, *, load: LoadFn | None = None
) -> WeightSyncReceiver:
    """Mount the weight-sync routes for an `EmbeddedEngine` on `app`; returns the receiver.

    Pushes are received in place when the engine has `update_weights_in_place`. `load`
    replaces `engine.update_weights(state, version=..., strict=...)` (and turns in-place
    receiving off; tests use it to simulate a server that skips updates).
    """
    model: torch.nn.Module = engine.model

    def default_load(state: dict[str, torch.Tensor], version: int, strict: bool) -> int:
        return int(engine.update_weights(state, version=version, strict=strict))

    live = LiveStateDict(model)

    def shapes() -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in live().items()}

    load_in_place: InPlaceLoadFn | None = None
    update_in_place = getattr(engine, "update_weights_in_place", None)
    if load is None and callable(update_in_place):

        def load_in_place(fill: Callable[[], None], version: int) -> int:
            return int(update_in_place(lambda _model: fill(), version=version))

    receiver = WeightSyncReceiver(
        load or default_load,
        shapes,
        device=next(model.parameters()).device,
        targets=live,
        load_in_place=load_in_place,
        arrange=lambda groups: pack_parameters_(model, groups),
        rehome=lambda names: rehome_(model, names),
    )
    app.include_router(weight_sync_router(receiver, token, tensors=len(live())))
    return receiver


def _manifest_bound(tensors: int) -> JSONBound:
    """A manifest lists each tensor as [name, dtype, [dims...], bucket, offset]: ~10 commas
    and brackets; 16 each leaves room for more dimensions and the other fields."""
    return JSONBound(
        limit=MIN_JSON_VALUES + 16 * tensors,
        covers=f"a weight manifest of this model's {tensors} tensors needs",
        fix="send the manifest of the model this server serves",
    )


def rehome_(model: torch.nn.Module, names: Iterable[str]) -> None:
    """Move each named parameter or buffer of `model` to fresh storage of its own (values
    kept), between forward passes. After a cancelled receive in place: what it posted into
    the old storage (and still takes, while its trainer sends) is then never served."""
    moved: set[int] = set()
    for name in names:
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        param = module._parameters.get(attr)
        if param is not None:
            if id(param) not in moved:  # tied: one parameter under two names
                moved.add(id(param))
                param.data = param.data.clone()
            continue
        buffer = module._buffers.get(attr)
        if buffer is not None:
            module._buffers[attr] = buffer.clone()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


async def _group(request: Request, route: str) -> str | None:
    """The group id a request's body carries (None from older trainers, which send no body);
    a 400 for a body that is not a JSON object, which must not pass for "no group"."""
    return _bad_request(group_in_body, await request.body(), route)


def _bad_request(parse: Callable[[Any, str], str | None], value: Any, route: str) -> str | None:
    try:
        return parse(value, route)
    except ValueError as e:
        raise HTTPException(400, str(e)) from e


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking receiver call off the event loop; WeightSyncError -> HTTP error."""
    try:
        return await asyncio.to_thread(fn, *args)
    except WeightSyncError as e:
        raise HTTPException(e.status, str(e)) from e
