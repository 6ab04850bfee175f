"""Server side of `BroadcastPolicyPublisher`: bearer-token routes that join the trainer's
process group, receive bucketed weights and load them into the served model.

Routes (mounted by `weight_routes.install_weight_sync_routes(app, engine, token)`):
`POST /ludic/weights/init` (join the group; returns at once, the join finishes in the
background), `POST /ludic/weights/start` (a manifest: validated against the served model, then
the buckets are received in the background), `POST /ludic/weights/finish` (wait for the bytes,
load them all at once, reply with the new policy version), `POST /ludic/weights/close`,
`GET /ludic/weights/status`. With `control="store"` in the init request, pushes skip `/start`
and `/finish`: a listener thread takes the same steps from keys in the trainer's TCPStore
(`ludic.distributed.control`), ~5-10 ms less per push. Requests never see half an update: an
engine offering `update_weights_in_place(fill, version=...)` (runs `fill(model)` between decode
steps) receives the bytes straight into its parameters while generation pauses (no extra copy
of the weights; the first push lays each packed bucket's parameters out back to back, so those
land without a copy too); otherwise the buckets land in buffers kept across pushes and are
loaded with `update_weights` once all have arrived. The reply to a push that asks for them (a
verified one) carries exact checksums of what the served model holds after loading
(`ludic.distributed.checksum`; received in place, each piece of each bucket is checksummed as it
lands, while the next arrives, and a tensor touched since is checksummed again after the load),
and the status its dtype; it serves no inference and does not verify pushes (the trainer compares).

A push holding a nan or an inf is refused (422; `weight_outcomes.NonfiniteRefusal` says when
the served model holds it); the group stays joined. A join that has not completed `timeout_s` after
`/init` gives up, with the reason in `join_error` and `last_error`; joins and pushes run on
daemon threads (`weight_join`), so a join blocked on an unreachable trainer never delays
the server's exit (one waiting for the store ends when abandoned, or at exit). A newer `/init`
or `/close` abandons a join in progress or frees the old group, closing its connections,
and ends a receive in flight on it (gloo: within a fraction of a second; its push fails naming
why), so the trainer that built it fails its next push at once. What that receive posted
still takes bytes its trainer sends (c10d cannot withdraw a posted receive), so never into
anything served or reused: the receiver's buffers are dropped with the group, and the live
tensors a receive in place posted into get fresh storage before generation resumes. Each `/init` answers with a
group id that the trainer's `/start`, `/finish` and `/close` carry; a `/init` from another
trainer replaces the group held (one log line), and the replaced trainer's next push or close
is refused (409 naming the trainer that joined: `weight_tenure`), so a stray close never
frees the newer group and two trainers never take the server from each other silently.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Literal

import torch
import torch.distributed as dist

from ludic.distributed.checksum import LandedChecksums
from ludic.distributed.control import StoreControl, TrainerGone
from ludic.distributed.manifest import ManifestError, WeightManifest, check_against
from ludic.distributed.quiet_c10d import quiet_c10_warnings
from ludic.distributed.transfer import (
    BufferPool,
    Cancel,
    Collective,
    ReceiveCancelled,
    adjacent_view,
    join_store,
    receive_buckets,
    receive_into,
)
from ludic.inference.http.weight_join import (
    InitRequest,
    Link,
    describe_store,
    in_background,
    join_failed,
    join_in_background,
    link_status,
)
from ludic.inference.http.weight_outcomes import (
    NonfiniteRefusal,
    SyncResult,
    WeightSyncError,
    held_checksums,
    receive_failed,
    served_dtype,
)
from ludic.inference.http.weight_tenure import Tenure
from ludic.inference.weights import NonFiniteWeightsError, check_finite

logger = logging.getLogger(__name__)

# load(state, version, strict) installs the weights and returns the served policy version.
LoadFn = Callable[[dict[str, torch.Tensor], int, bool], int]
# load_in_place(fill, version) runs fill() with generation paused, then serves `version`.
InPlaceLoadFn = Callable[[Callable[[], None], int], int]

# What `GET /ludic/weights/status` offers under "controls"; the publisher picks from it.
CONTROLS = ("http", "store")
# How long `close()` waits for the store-driven listener to finish with the trainer's store.
_CLOSE_WAIT_S = 5.0


class WeightSyncReceiver:
    """Receives pushes one at a time, driven by HTTP (`start`/`finish`, on a worker thread) or
    by the trainer's store (`control="store"`: a listener thread).

    `shapes()` gives the served model's tensor shapes, used to refuse a manifest before any
    byte is sent. `device` is where buckets land (the model's device; CUDA for NCCL). With
    `targets` (the live tensors) and `load_in_place`, buckets are received straight into the
    targets inside `load_in_place` (a failed push may then leave the model partly updated:
    the next full push repairs it); otherwise into reused buffers, handed to `load`. With
    `arrange` too, the first push of each bucket layout calls `arrange(groups)` (the names of
    each packed bucket) inside `load_in_place` first, to lay those targets out back to back so
    that packed buckets land without a copy (`ludic.inference.weights.pack_parameters_`);
    groups already back to back are left where they are. The planner keeps the groups a
    server fuses (`ludic.distributed.manifest.fused_groups`) consecutive in one bucket, so
    their new layout stays fusable; an engine drops what pins the old storage (the lean
    forward's fused views) before `load_in_place` runs the fill, so the old storage is
    freed as the parameters move (about one bucket's worth of extra memory at a time).
    In place, a receive is cancelled (gloo) only with `rehome(names)`, which moves those
    targets to fresh storage (values kept): what was posted lands in the old, never served.
    """

    def __init__(
        self,
        load: LoadFn,
        shapes: Callable[[], Mapping[str, tuple[int, ...]]],
        *,
        device: torch.device | str,
        targets: Callable[[], Mapping[str, torch.Tensor]] | None = None,
        load_in_place: InPlaceLoadFn | None = None,
        arrange: Callable[[list[list[str]]], object] | None = None,
        rehome: Callable[[list[str]], object] | None = None,
    ) -> None:
        self.load = load
        self.arrange, self.rehome = arrange, rehome
        self._arranged: list[list[str]] | None = None
        self.shapes = shapes
        self.device = device
        self.targets = targets
        self.load_in_place = load_in_place if targets is not None else None
        self._pool = BufferPool(device)
        self._lock = threading.Lock()
        self._link: Future[Link] | None = None
        self._store_at: str | None = None  # "host:port" of the trainer store of `_link`
        self._control: Literal["http", "store"] = "http"
        self._stop_listening = threading.Event()
        self._listening: StoreControl | None = None  # the listener's channel, to wake it
        self._listener: threading.Thread | None = None
        self._push: Future[SyncResult] | None = None
        self._join_timeout_s = 120.0
        self._tenure = Tenure()  # the held group's id and trainer, and the groups replaced
        self._cancel = Cancel()  # ends a receive in flight on the held group
        self.last: SyncResult | None = None
        self.last_error: str | None = None

    def init(self, req: InitRequest) -> str:
        """Start joining the trainer's group in the background (replacing any older group);
        returns the new group's id."""
        with self._lock:
            old = self._tenure.current
            holder, replaced = self._tenure.begin(f"{req.host}:{req.port}", req.trainer)
            why = None if old is None else self._tenure.replaced_by(old.group)
            self._forget_link(why or "a newer weight-sync group of the same trainer replaced it")
            if replaced is not None:
                logger.warning("%s", replaced)
            self._cancel = Cancel()
            self.last_error = None  # the old group's failure is not this one's state
            self._join_timeout_s = req.timeout_s
            self._link = join_in_background(req)  # weight_join: a daemon thread, a deadline
            self._store_at = f"{req.host}:{req.port}"
            where = describe_store(req)
            self._link.add_done_callback(lambda joining: self._join_ended(joining, where))
            self._control = req.control
            if req.control == "store":
                self._stop_listening = threading.Event()
                self._listener = threading.Thread(
                    target=self._listen,
                    args=(self._link, self._stop_listening, req, self._cancel),
                    name="ludic-weights-listen",
                    daemon=True,
                )
                self._listener.start()
            return holder.group

    def _join_ended(self, joining: Future[Link], where: str) -> None:
        """Record why a join failed in `last_error` (while it is still the current one)."""
        if joining.cancelled():  # abandoned by `_forget_link`: a newer /init or a /close
            return
        error = joining.exception()
        if error is not None and self._link is joining:  # may run inside `init`: no lock
            self.last_error = join_failed(error, where)

    def start(
        self, manifest: WeightManifest, store: str | None = None, group: str | None = None
    ) -> None:
        """Validate `manifest` and start receiving its buckets in the background. `group`
        (the id `init` returned) or, from older trainers, `store` (the "host:port" of the
        sender's group): a push from another group than the one held is refused (409), so it
        never waits on bytes that will not come."""
        with self._lock:
            self._tenure.check(group)
            if self._link is None:
                raise WeightSyncError("no communicator: POST /ludic/weights/init first")
            if store is not None and self._store_at is not None and store != self._store_at:
                raise WeightSyncError(
                    f"no communicator for the trainer at {store}: this server is in another "
                    f"trainer's weight-sync group now (store at {self._store_at}); POST "
                    "/ludic/weights/init to rejoin"
                )
            if self._control == "store":
                raise WeightSyncError(
                    "this communicator's pushes are driven through the trainer's store "
                    "(control='store'), not /start: POST /ludic/weights/init with control='http'"
                )
            if self._push is not None:
                raise WeightSyncError("a push is already in progress: finish it first")
            self._check(manifest)
            joined, cancel, pool = self._joined(self._link).joined(), self._cancel, self._pool
            self._push = in_background(
                lambda: self._receive(joined, manifest, cancel, pool), name="ludic-weights-push"
            )

    def _check(self, manifest: WeightManifest) -> None:
        # the live tensors' dtypes: an int buffer sent as float (or the reverse) is refused here,
        # before any byte moves, not cast into nonsense or refused at load
        dtypes = None if self.targets is None else {n: t.dtype for n, t in self.targets().items()}
        try:
            check_against(manifest, self.shapes(), dtypes)
        except ManifestError as e:
            raise WeightSyncError(f"refused weight manifest: {e}", status=400) from e

    def _receive(
        self, group: Collective, manifest: WeightManifest, cancel: Cancel, pool: BufferPool
    ) -> SyncResult:
        """Receive and load one push into `pool` (the receiver's, dropped by `_forget_link`
        once this group is left) or in place; `cancel` ends it (ReceiveCancelled) if its group
        is replaced or left first. Only gloo receives look at it (waiting on an NCCL work with
        a timeout would abort the communicator), in place only with `rehome`."""
        in_place = self.load_in_place is not None and self.targets is not None
        gloo = isinstance(group, dist.ProcessGroupGloo)
        stop = cancel if gloo and (self.rehome is not None or not in_place) else None
        landed = LandedChecksums() if manifest.checksums else None
        if self.load_in_place is not None and self.targets is not None:
            targets = self.targets

            def fill() -> None:
                groups = [[e.name for e in entries] for entries in manifest.bucket_entries()]
                packed = [names for names in groups if len(names) > 1]
                if self.arrange is not None and packed != self._arranged:
                    apart = self._apart(packed)
                    if apart:  # those already back to back (e.g. a fused q/k/v) stay put
                        self.arrange(apart)
                    self._arranged = packed
                live = targets()

                def take(progress: list[tuple[str, torch.Tensor, int]]) -> None:
                    assert landed is not None  # while the next piece arrives
                    for name, tensor, upto in progress:
                        landed.advance(name, tensor, upto)

                on_landed = take if landed else None
                try:
                    receive_into(group, manifest, live, pool=pool, on_landed=on_landed, cancel=stop)
                except ReceiveCancelled:  # its posted receives land in the old storage
                    assert self.rehome is not None
                    self.rehome([e.name for e in manifest.tensors])
                    self._arranged = None  # the next push lays packed buckets out again
                    raise
                try:  # before the engine serves the new version
                    check_finite({e.name: live[e.name] for e in manifest.tensors})
                except NonFiniteWeightsError as e:
                    raise NonfiniteRefusal(e, landed_in_place=True) from e

            version = self.load_in_place(fill, manifest.version)
        else:
            state = receive_buckets(group, manifest, pool=pool, cancel=stop)
            try:  # the engine's own load may not check
                check_finite(state)
            except NonFiniteWeightsError as e:
                raise NonfiniteRefusal(e, landed_in_place=False) from e
            version = self.load(state, manifest.version, manifest.full)
        live = None if self.targets is None else self.targets()
        checksums, held_dtypes = held_checksums(manifest, landed, live)
        return SyncResult(
            policy_version=version,
            num_tensors=len(manifest.tensors),
            num_bytes=manifest.total_bytes,
            checksums=checksums,
            held_dtypes=held_dtypes,
        )

    def _apart(self, packed: list[list[str]]) -> list[list[str]]:
        """The groups whose targets do not lie back to back yet (no reference to the targets
        outlives this call: they would keep the old storage alive while `arrange` moves
        them)."""
        assert self.targets is not None
        live = self.targets()
        return [names for names in packed if adjacent_view([live[n] for n in names]) is None]

    def _listen(
        self, joining: Future[Link], stop: threading.Event, req: InitRequest, cancel: Cancel
    ) -> None:
        """Serve store-driven pushes until the trainer closes the channel or goes away."""
        timeout_s = req.timeout_s
        try:
            link = joining.result(timeout=timeout_s)
        except Exception:
            return  # `status()` reports the join error
        try:  # a client of its own to block on (the link's client stays free to wake it)
            waits_on = join_store(
                req.host, req.port, world_size=req.world_size, timeout_s=timeout_s
            )
        except RuntimeError as e:
            self.last_error = f"weight-sync listener could not reach the trainer's store: {e}"
            return
        channel = StoreControl(waits_on, waker=link.store, rank=req.rank)
        with self._lock:
            if stop.is_set():
                return
            self._listening = channel
        layouts: dict[str, WeightManifest] = {}  # accepted on this channel: no ack needed
        trainer = f"weight-sync trainer at {req.host}:{req.port}"
        while True:
            try:
                body = channel.next_request(stop)
                if body.get("close"):
                    if not stop.is_set():  # the trainer said goodbye (not our own wake-up)
                        self._leave(stop, f"{trainer} closed its group")
                        with contextlib.suppress(RuntimeError), quiet_c10_warnings():
                            channel.reply("ack", {"ok": True})  # the last use of its store
                    return
                manifest = channel.accept(body, layouts, self._check)
                served = manifest is None or self._serve_push(
                    channel, joining, manifest, stop, cancel
                )
                if not served:
                    return
            except TrainerGone as e:  # exited without a goodbye, or killed
                self._leave(stop, f"{trainer} went away (its store closed)", error=str(e))
                return
            except RuntimeError as e:  # ControlChannelClosed, or the store failed mid-push
                self._leave(stop, f"{trainer}: weight-sync listener stopped", str(e), cause=e)
                return

    def _serve_push(
        self,
        channel: StoreControl,
        joining: Future[Link],
        manifest: WeightManifest,
        stop: threading.Event,
        cancel: Cancel,
    ) -> bool:
        """Receive one store-driven push on the group `joining` joined and reply; False once
        this group is done."""
        with self._lock:
            if stop.is_set():
                return False
            self._push, pool = Future(), self._pool  # `status()` shows a push in progress
        try:
            result = self._receive(joining.result().joined(), manifest, cancel, pool)
        except NonfiniteRefusal as e:  # every byte arrived: the group is still usable
            self.last_error = str(e)
            channel.reply("done", {"error": str(e), "status": e.status})
            return True
        except Exception as e:
            if stop.is_set():  # a newer group replaced this one: leave it alone
                if isinstance(e, ReceiveCancelled):  # its trainer waits: say why (best effort)
                    with contextlib.suppress(RuntimeError), quiet_c10_warnings():
                        channel.reply("done", {"error": str(e), "status": 409})
                return False
            error = self._failed(e, joining)
            logger.error("%s", error, exc_info=logger.isEnabledFor(logging.DEBUG))
            with quiet_c10_warnings():  # the trainer may be gone: then so is its store
                channel.reply("done", {"error": str(error), "status": error.status})
            return False
        finally:
            with self._lock:
                if not stop.is_set():
                    self._push = None
        self.last = result
        channel.reply("done", result.to_dict())
        return True

    def _leave(
        self,
        stop: threading.Event,
        what: str,
        error: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        """The listener's trainer is done: free its group (unless a newer one replaced it),
        log one line (with `cause` when it is an unexpected error; its traceback at debug
        level) and keep `error` in `last_error` (None after a goodbye)."""
        with self._lock:
            if stop.is_set():
                return
            self._listening = None  # the listener is ending: nothing to wake on a closed store
            self._forget_link(what)
            self._tenure.end()
            self._listener = None
            if error is not None:
                self.last_error = f"{what}: {error}"
        if cause is None:
            logger.warning("%s; waiting for a trainer to join", what)
        else:
            debug = logger.isEnabledFor(logging.DEBUG)
            logger.error("%s (%s); waiting for a trainer to join", what, error, exc_info=debug)

    def _joined(self, joining: Future[Link]) -> Link:
        try:
            return joining.result(timeout=self._join_timeout_s)
        except Exception as e:
            self._link = None
            raise WeightSyncError(join_failed(e)) from e

    def finish(self, group: str | None = None) -> SyncResult:
        """Wait until the push is received and loaded; return the new version (blocks).
        `group`: as for `start`."""
        with self._lock:
            self._tenure.check(group)
            if self._push is None or self._control == "store":
                raise WeightSyncError("no push in progress: POST /ludic/weights/start first")
            push, self._push = self._push, None
            link = self._link
        try:
            self.last = push.result()
        except NonfiniteRefusal as e:  # every byte arrived: the group is still usable
            self.last_error = str(e)
            raise
        except ReceiveCancelled as e:  # its group was replaced or left: not this one's failure
            raise WeightSyncError(str(e)) from e
        except Exception as e:  # a failed collective leaves the group unusable
            raise self._failed(e, link) from e
        return self.last

    def _failed(self, e: Exception, link: Future[Link] | None) -> WeightSyncError:
        """Forget the group `link` joined (a failed collective leaves it unusable) unless a
        newer one replaced it (its state is then left alone); the error to report."""
        with self._lock:
            current = link is not None and self._link is link
            if current:
                self._forget_link(f"its receive failed ({type(e).__name__})")
                self._tenure.end()
        error = receive_failed(e, in_place=self.load_in_place is not None)
        if current:
            self.last_error = str(error)
        return error

    def _forget_link(self, why: str) -> None:
        """Leave the current group: stop its listener, end a receive in flight on it (its push
        fails saying `why`) and close its connections, so that the trainer that built it
        fails its next push at once instead of broadcasting into a group nobody receives from
        until its timeout."""
        self._cancel.set(f"the weight push was abandoned: {why}")
        self._stop_listening.set()
        if self._listening is not None:
            self._listening.wake()
            self._listening = None
        link = self._link
        # a join still pending is abandoned (one waiting for an unreachable store ends at
        # once: `weight_join`); a completed one's group is freed
        if link is not None and not link.cancel() and link.exception() is None:
            link.result().release()
        self._link, self._push, self._store_at = None, None, None
        self._pool = BufferPool(self.device)  # a receive left on it may still take bytes

    def close(self, group: str | None = None) -> None:
        """Leave the group. With `group` (the id `init` returned), only that group: a close for
        one another trainer replaced is refused (409, `GroupReplaced`) and frees nothing; one
        for a group no longer held while none is held does nothing. A store-driven listener is
        woken and waited for (a few seconds at most), so that a trainer closing its store once
        this returns (the `/close` request) does not fail the listener's last store call: that
        would log a c10d stack trace and report a lost trainer in `last_error` after a normal
        end."""
        with self._lock:
            held = self._tenure.current
            if group is not None and (held is None or held.group != group):
                if held is None and self._tenure.replaced_by(group) is None:
                    return  # already left (or the server restarted): nothing to free
                self._tenure.check(group)  # raises: it names who holds the server now
            self._forget_link("its trainer closed the group")
            self._tenure.end()
            listener, self._listener = self._listener, None
        if listener is not None and listener is not threading.current_thread():
            listener.join(timeout=_CLOSE_WAIT_S)

    def status(self, group: str | None = None) -> dict[str, Any]:
        """What `GET /ludic/weights/status` answers; with `group` (`?group=`), also whether
        another trainer replaced that group (`replaced_by`: the refusal its pushes get)."""
        with self._lock:
            return {
                **link_status(self._link),
                "in_progress": self._push is not None,
                "last_version": None if self.last is None else self.last.policy_version,
                "last_error": self.last_error,
                "control": self._control,
                "controls": list(CONTROLS),
                "store": self._store_at,  # whose group this is (a trainer tells its own)
                **self._tenure.report(group),
                "dtype": None if self.targets is None else served_dtype(self.targets()),
                "pieces": True,  # buckets may come in several broadcasts (`piece_bytes`)
            }
