"""Server side of `BroadcastPolicyPublisher`: bearer-token routes that join the trainer's
process group, receive bucketed weights and load them into the served model.

Routes (mounted with `install_weight_sync_routes(app, engine, token)`):
`POST /ludic/weights/init` (join the group; returns at once, the join finishes in the
background), `POST /ludic/weights/start` (a manifest: validated against the served model, then
the buckets are received in the background), `POST /ludic/weights/finish` (wait for the bytes,
load them all at once, reply with the new policy version), `POST /ludic/weights/close`,
`GET /ludic/weights/status`. Requests never see half an update: an engine offering
`update_weights_in_place(fill, version=...)` (runs `fill(model)` between decode steps) receives
the bytes straight into its parameters while generation pauses (no extra copy of the weights);
otherwise the buckets land in buffers kept across pushes and are loaded with
`update_weights` once all have arrived. It serves no inference and does not verify pushes (the
trainer does).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import torch
from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from ludic.distributed.manifest import ManifestError, WeightManifest, check_against
from ludic.distributed.transfer import (
    BufferPool,
    Collective,
    join_store,
    open_group,
    receive_buckets,
    receive_into,
)

# load(state, version, strict) installs the weights and returns the served policy version.
LoadFn = Callable[[dict[str, torch.Tensor], int, bool], int]
# load_in_place(fill, version) runs fill() with generation paused, then serves `version`.
InPlaceLoadFn = Callable[[Callable[[], None], int], int]


class InitRequest(BaseModel):
    """Where the trainer's TCPStore listens and how to build the group."""

    host: str
    port: int = Field(ge=1, le=65535)
    backend: Literal["gloo", "nccl"] = "gloo"
    world_size: int = Field(default=2, ge=2)
    rank: int = Field(default=1, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncResult:
    policy_version: int
    num_tensors: int
    num_bytes: int


class WeightSyncError(RuntimeError):
    """A push could not be received or loaded (`status` is the HTTP status to answer with)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class WeightSyncReceiver:
    """Receives pushes one at a time on a worker thread.

    `shapes()` gives the served model's tensor shapes, used to refuse a manifest before any
    byte is sent. `device` is where buckets land (the model's device; CUDA for NCCL). With
    `targets` (the live tensors) and `load_in_place`, buckets are received straight into the
    targets inside `load_in_place` (a failed push may then leave the model partly updated:
    the next full push repairs it); otherwise into reused buffers, handed to `load`.
    """

    def __init__(
        self,
        load: LoadFn,
        shapes: Callable[[], Mapping[str, tuple[int, ...]]],
        *,
        device: torch.device | str,
        targets: Callable[[], Mapping[str, torch.Tensor]] | None = None,
        load_in_place: InPlaceLoadFn | None = None,
    ) -> None:
        self.load = load
        self.shapes = shapes
        self.device = device
        self.targets = targets
        self.load_in_place = load_in_place if targets is not None else None
        self._pool = BufferPool(device)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-weights")
        self._lock = threading.Lock()
        self._group: Future[Collective] | None = None
        self._push: Future[SyncResult] | None = None
        self._join_timeout_s = 120.0
        self.last: SyncResult | None = None

    def init(self, req: InitRequest) -> None:
        """Start joining the trainer's group in the background (replacing any older group)."""
        with self._lock:
            self._push = None
            self._join_timeout_s = req.timeout_s
            # A fresh worker: one still blocked on a dead trainer's push must not delay the join.
            self._worker.shutdown(wait=False)
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-weights")

            def join() -> Collective:
                store = join_store(
                    req.host, req.port, world_size=req.world_size, timeout_s=req.timeout_s
                )
                return open_group(
                    store,
                    rank=req.rank,
                    world_size=req.world_size,
                    backend=req.backend,
                    timeout_s=req.timeout_s,
                )

            self._group = self._worker.submit(join)

    def start(self, manifest: WeightManifest) -> None:
        """Validate `manifest` and start receiving its buckets in the background."""
        with self._lock:
            if self._group is None:
                raise WeightSyncError("no communicator: POST /ludic/weights/init first")
            if self._push is not None:
                raise WeightSyncError("a push is already in progress: finish it first")
            try:
                check_against(manifest, self.shapes())
            except ManifestError as e:
                raise WeightSyncError(f"refused weight manifest: {e}", status=400) from e
            group = self._joined(self._group)
            self._push = self._worker.submit(self._receive, group, manifest)

    def _receive(self, group: Collective, manifest: WeightManifest) -> SyncResult:
        if self.load_in_place is not None and self.targets is not None:
            targets = self.targets

            def fill() -> None:
                receive_into(group, manifest, targets(), pool=self._pool)

            version = self.load_in_place(fill, manifest.version)
        else:
            state = receive_buckets(group, manifest, pool=self._pool)
            version = self.load(state, manifest.version, manifest.full)
        return SyncResult(
            policy_version=version,
            num_tensors=len(manifest.tensors),
            num_bytes=manifest.total_bytes,
        )

    def _joined(self, joining: Future[Collective]) -> Collective:
        try:
            return joining.result(timeout=self._join_timeout_s)
        except Exception as e:
            self._group = None
            raise WeightSyncError(
                f"could not join the trainer's process group ({type(e).__name__}: {e}); "
                "POST /ludic/weights/init again"
            ) from e

    def finish(self) -> SyncResult:
        """Wait until the push is received and loaded; return the new version (blocks)."""
        with self._lock:
            if self._push is None:
                raise WeightSyncError("no push in progress: POST /ludic/weights/start first")
            push, self._push = self._push, None
        try:
            self.last = push.result()
        except Exception as e:  # a failed collective leaves the group unusable
            with self._lock:
                self._group = None
            partly = " (the served model may be partly updated: push again)"
            raise WeightSyncError(
                f"receiving weights failed ({type(e).__name__}: {e}); POST /init again"
                + (partly if self.load_in_place is not None else ""),
                status=500,
            ) from e
        return self.last

    def close(self) -> None:
        with self._lock:
            self._group, self._push = None, None

    def status(self) -> dict[str, Any]:
        with self._lock:
            group = self._group
            connected = group is not None and group.done() and group.exception() is None
            error = None
            if group is not None and group.done() and group.exception() is not None:
                error = f"{type(group.exception()).__name__}: {group.exception()}"
            return {
                "connected": connected,
                "joining": group is not None and not group.done(),
                "join_error": error,
                "in_progress": self._push is not None,
                "last_version": None if self.last is None else self.last.policy_version,
            }


def weight_sync_router(receiver: WeightSyncReceiver, token: str | None) -> APIRouter:
    """The `/ludic/weights/*` routes over `receiver`, guarded by the bearer `token`."""
    bearer = HTTPBearer(auto_error=False)

    def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is None:
            raise HTTPException(403, "weight sync is disabled: start the server with a token")
        if credentials is None or not secrets.compare_digest(credentials.credentials, token):
            raise HTTPException(401, "missing or wrong bearer token for a control endpoint")

    router = APIRouter(prefix="/ludic/weights", dependencies=[Depends(require_token)])

    @router.post("/init")
    async def init(req: InitRequest) -> dict[str, str]:
        receiver.init(req)
        return {"status": "joining"}

    @router.post("/start")
    async def start(body: dict[str, Any]) -> dict[str, str]:
        try:
            manifest = WeightManifest.from_json(body)
        except ManifestError as e:
            raise HTTPException(400, str(e)) from e
        await _call(receiver.start, manifest)
        return {"status": "receiving"}

    @router.post("/finish")
    async def finish() -> dict[str, int]:
        result: SyncResult = await _call(receiver.finish)
        return {
            "policy_version": result.policy_version,
            "num_tensors": result.num_tensors,
            "num_bytes": result.num_bytes,
        }

    @router.post("/close")
    async def close() -> dict[str, str]:
        receiver.close()
        return {"status": "closed"}

    @router.get("/status")
    async def status() -> dict[str, Any]:
        return receiver.status()

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

    def shapes() -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in model.state_dict().items()}

    load_in_place: InPlaceLoadFn | None = None
    update_in_place = getattr(engine, "update_weights_in_place", None)
    if load is None and callable(update_in_place):

        def load_in_place(fill: Callable[[], None], version: int) -> int:
            return int(update_in_place(lambda _model: fill(), version=version))

    receiver = WeightSyncReceiver(
        load or default_load,
        shapes,
        device=next(model.parameters()).device,
        targets=model.state_dict,
        load_in_place=load_in_place,
    )
    app.include_router(weight_sync_router(receiver, token))
    return receiver


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking receiver call off the event loop; WeightSyncError -> HTTP error."""
    try:
        return await asyncio.to_thread(fn, *args)
    except WeightSyncError as e:
        raise HTTPException(e.status, str(e)) from e
