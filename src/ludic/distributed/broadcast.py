"""`BroadcastPolicyPublisher`: pushes trainer weights to one or many inference servers over a
`torch.distributed` data plane, then verifies that each server serves them.

One push: send the manifest (names, shapes, dtypes, buckets, version) to every server, wait for
those that must accept a new layout, broadcast the buckets once over the standalone group
(trainer = rank 0, the servers' ranks after it, tensor-parallel ranks included), wait for each
server's reply (it loads the weights and reports its version and checksums), then check each
one's `/ludic/version` and a logprob probe against the trainer's own model
(`ludic.distributed.push_verifier`). The manifest and replies travel as keys in the trainer's
TCPStore when a server offers that (`control="store"`, the embedded server: no HTTP request per
push, `ludic.distributed.control`), else as POST `/ludic/weights/start` and `/finish` (the vLLM
extension); joining, status and the probe use HTTP either way. The server side is
`ludic.inference.http.weight_receiver`.

Many servers: a server that cannot be reached, or dies during a push, is named (in a warning,
in `last_push.missed`, and in the error when fewer than `min_servers` took the push); the push
is redone at once over a fresh group of the servers still there, and a server that comes back
(restarted) is re-initialised into the group at the next push, which brings it to the current
version. Under FSDP either call `publish` with the sharded model on every rank (the full state
dict is gathered, a collective; rank 0 pushes, the other ranks return) or, as the Trainer
does, gather first and call it on rank 0 with the state dict; verification never runs a
collective. Weights holding a nan or an inf are never sent: `publish` raises
`NonFiniteWeightsError` first (one float sum per tensor), since `ludic serve` receives in place
and could only refuse them once they had landed. A server's refusal of a push (a 4xx) raises
`PushRefused` (a `WeightPushError` naming each server, its HTTP status, its words and what to
do) and is not retried, except one saying it has no communicator (it left this trainer's
group: it restarted): the publisher then rejoins (a new `/init` and join for every server, as
its first connect) and retries that push once, logging one line that says so; failing again
raises `WeightPushError` naming why. A server that says another trainer joined it and
replaced this trainer's group raises `TrainerReplaced` naming that trainer (host, pid), now
and at every later `publish`: the two trainers would otherwise take the server from each
other at every push. With
`take_over=True` the publisher instead takes the server back (rejoins and retries once,
logging a warning naming the other trainer). It does not balance or route inference requests
(`ludic.inference.http.pool`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx
import torch
import torch.distributed as dist

from ludic.distributed.checksum import RunningChecksums
from ludic.distributed.control import StoreControl
from ludic.distributed.interfaces import Weights, check_publishable
from ludic.distributed.live_state import LiveStateDict
from ludic.distributed.manifest import WeightManifest
from ludic.distributed.push_records import (
    PlanCache,
    PushCheck,
    PushStats,
    expected_casts,
    gather_full_state_dict,
    wire_tensors,
)
from ludic.distributed.push_verifier import PushVerifier
from ludic.distributed.server_group import PushFailed, ServerGroup, ServerLeftGroup, links
from ludic.distributed.server_link import ServerLink, TrainerReplaced, WeightPushError
from ludic.distributed.transfer import (
    Backend,
    BufferPool,
)

logger = logging.getLogger(__name__)

__all__ = ["BroadcastPolicyPublisher", "PushStats", "TrainerReplaced", "WeightPushError"]


class BroadcastPolicyPublisher:
    """Publishes to the server(s) at `base_url` (one URL or several) whose control endpoints
    take bearer `token`.

    - `backend`: "gloo" (CPU tensors) or "nccl" (tensors on `device`, a CUDA device).
    - `bucket_mb`, `pack_below_mb`: tensors smaller than `pack_below_mb` are packed into
      broadcasts of at most `bucket_mb`; larger ones are broadcast alone, in place (no copy).
    - `piece_mb`: a bucket larger than this goes as several broadcasts of this size, so that
      both sides checksum each piece just after the transport read or wrote it, while the
      next one is on the wire (a large embedding is not read again after it landed);
      0: one broadcast per bucket. Whole buckets also when a server's status does not say
      `"pieces": true` (an older server, which would expect one broadcast per bucket).
    - `wire_dtype`: cast floating tensors before sending (e.g. bfloat16 for a bf16 server).
    - `verify`: after each push, check on every server the version it reports, exact
      checksums of every tensor it holds after loading against the sent ones (a skipped
      tensor, a load that never happened, a dropped tiny update). (Whether the weights are
      finite is checked before every push, verified or not: see `publish`.) With `probe`, also on the first push of each connection and every
      `probe_every`-th push: the server's `/ludic/logprobs` on `probe_token_ids` (default: 16
      fixed pseudo-random ids) against the trainer's within `atol` for a full-precision
      server, widened for a half-precision one (`verification.PROBE_ATOL`: 0.05 float16, 0.2
      bfloat16, from the dtype the server reports); nan or inf logprobs always fail. The
      probe checks the server's numerics (its forward, dtype, config), which do not change
      between pushes, and costs two forward passes, more than the whole transfer of a small
      model on a CPU: `probe_every=1` probes every push. The trainer's logprobs come from the
      published model, or, when `publish` gets a state dict (as the Trainer passes), from
      `probe_model` (the model that state came from; with LoRA its forward matches the merged
      weights). When that model is sharded (FSDP2) its forward would be a collective on rank
      0 alone, so the reference runs on a non-sharded twin holding the gathered state instead
      (no other rank is involved). Without a model only the server's logprobs are checked
      for being finite (a warning says so once). A server that fails verification fails the
      push (PublishVerificationError naming it), however many others passed.
    - `control`: how pushes are driven: "store" (manifest and replies as keys in the trainer's
      TCPStore), "http" (`/start` and `/finish` requests), "auto" (store when the server
      offers it in `/ludic/weights/status`; chosen per server).
    - `server_ranks`: receiving ranks of each server (vLLM with tensor parallelism: TP); one
      number for all, or one per URL.
    - `min_servers`: the push fails (TooFewServers, a WeightPushError naming each server that
      did not take it) when fewer servers than this took it; the others are named in a warning
      and in `last_push.missed`, and rejoin when they answer again. Default 1: rollouts carry on on
      the servers left. `min_servers=len(urls)` makes every server mandatory.
    - `take_over`: when another trainer has joined a server and replaced this one's group
      there, take the server back (rejoin and retry the push once, with a warning naming the
      other trainer) instead of raising `TrainerReplaced` (the default: two trainers on one
      server would take it from each other at every push). Set it on a trainer meant to
      replace one that may still be running (the other one then stops with the refusal,
      unless it may take over too: then they alternate, each push logged on both sides).
    - `master_addr`: this trainer's address as the servers see it (it hosts the TCPStore).
    - `rank`: this process's trainer rank (default: the default group's rank, else 0).
    - `http`: the HTTP client of each server (tests: a FastAPI TestClient); default: httpx.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        token: str,
        *,
        backend: Backend = "gloo",
        bucket_mb: float = 64.0,
        pack_below_mb: float = 1.0,
        piece_mb: float = 16.0,
        device: str | torch.device | None = None,
        wire_dtype: torch.dtype | None = None,
        verify: bool = True,
        probe: bool = True,
        probe_every: int = 10,
        probe_token_ids: Sequence[int] | None = None,
        probe_model: torch.nn.Module | None = None,
        atol: float = 1e-3,
        master_addr: str = "127.0.0.1",
        timeout_s: float = 120.0,
        rank: int | None = None,
        server_ranks: int | Sequence[int] = 1,
        min_servers: int = 1,
        control: Literal["auto", "http", "store"] = "auto",
        take_over: bool = False,
        http: httpx.Client | Sequence[httpx.Client] | None = None,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (GPU), got {backend!r}")
        if bucket_mb <= 0 or pack_below_mb <= 0:
            raise ValueError(
                f"bucket_mb and pack_below_mb must be > 0: {bucket_mb}, {pack_below_mb}"
            )
        if piece_mb < 0:
            raise ValueError(f"piece_mb must be >= 0 (0: whole buckets), got {piece_mb}")
        if control not in ("auto", "http", "store"):
            raise ValueError(f"control must be 'auto', 'http' or 'store', got {control!r}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        if probe_token_ids is not None and len(probe_token_ids) < 2:
            raise ValueError("probe_token_ids needs at least 2 tokens (a prefix and a target)")
        self.fleet = ServerGroup(
            links(base_url, token, server_ranks, timeout_s, http),
            backend=backend,
            master_addr=master_addr,
            timeout_s=timeout_s,
            control=control,
            min_servers=min_servers,
        )
        self.backend: Backend = backend
        self.bucket_bytes = max(1, int(bucket_mb * 2**20))
        self.alone_bytes = max(1, int(pack_below_mb * 2**20))
        self.piece_bytes = int(piece_mb * 2**20)
        self.device = torch.device(device or ("cuda" if backend == "nccl" else "cpu"))
        self._pool = BufferPool(self.device)  # packing buffers, kept across pushes
        self.wire_dtype = wire_dtype
        self.verify = verify
        self.probe = probe
        self.probe_every = probe_every
        self._num_pushes = 0
        self._verifier = PushVerifier(probe_token_ids)
        self.probe_model = probe_model
        self._warned_no_probe = False
        self._warned_whole = False
        self.atol = atol
        self.rank = rank
        self.take_over = take_over
        self._replaced: TrainerReplaced | None = None  # raised again by every later publish
        self._plans = PlanCache()
        self._live: LiveStateDict | None = None  # the last published module's state dict
        self.last_push: PushStats | None = None

    @property
    def servers(self) -> list[ServerLink]:
        return self.fleet.servers

    @property
    def missed(self) -> dict[str, str]:
        """Servers left out of the group now (URL -> why); they rejoin when they answer."""
        return self.fleet.missed

    # The first server's view and the group's, as one-server code and tests read them.
    @property
    def http(self) -> httpx.Client:
        return self.servers[0].http

    @property
    def _channel(self) -> StoreControl | None:
        return self.servers[0].channel

    @property
    def _served_dtype(self) -> str | None:
        return self.servers[0].served_dtype

    @property
    def _store(self) -> Any:
        return self.fleet.store

    @property
    def probe_token_ids(self) -> list[int] | None:
        """The probe's tokens: `probe_token_ids`, else chosen at the first probe."""
        return self._verifier.probe_token_ids

    @probe_token_ids.setter
    def probe_token_ids(self, token_ids: list[int] | None) -> None:
        self._verifier.probe_token_ids = token_ids

    @property
    def _probe_always(self) -> bool:
        """A server holds tensors no checksum reaches: the probe runs on every push."""
        return self._verifier.probe_always

    # -- connection ---------------------------------------------------------------------

    def connect(self) -> None:
        """Build the group with every server that answers (blocks until they have joined)."""
        self.fleet.connect()

    def close(self) -> None:
        """Drop the group and tell the servers (best effort)."""
        self.fleet.close()

    def _drop_group(self) -> None:
        self.fleet.drop()

    # -- publishing ---------------------------------------------------------------------

    def publish(self, weights: Weights, *, version: int) -> None:
        """Push `weights` as policy `version` to every server and verify each; raises
        NonFiniteWeightsError, before contacting any server, if a tensor holds a nan or an inf
        (the policy diverged), PublishVerificationError if a server does not serve them,
        PushRefused (a WeightPushError) if one refused the push (a 4xx; not retried, unless it
        said it is not in the group: then rejoined and retried once, and WeightPushError if
        that fails again), TooFewServers (a WeightPushError) if fewer than `min_servers` took
        it (naming each server), TrainerReplaced (a WeightPushError) if another trainer
        replaced this one on a server (again at every later call; unless `take_over`)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"publish: version must be an int >= 0, got {version!r}")
        model = weights if isinstance(weights, torch.nn.Module) else self.probe_model
        state = self._full_state_dict(weights)  # a collective under FSDP: every rank calls it
        if self._rank() != 0:
            return  # nothing below is a collective: the probe runs on a non-sharded twin
        if self._replaced is not None:
            raise TrainerReplaced(str(self._replaced))
        if self.verify and self.probe and model is None and not self._warned_no_probe:
            logger.warning(
                "publishing a state dict without probe_model: the served weights are checked "
                "(checksums) but not the server's forward (pass probe_model=<the trainer's model>)"
            )
            self._warned_no_probe = True
        started = time.perf_counter()
        tensors = wire_tensors(state, self.wire_dtype, self.device)
        # as sent (a cast may overflow), before a byte; within finite_checked() (the Trainer
        # checked every rank's shards) only the tensors a cast narrowed
        check_publishable(tensors, version=version, cast_from=state)
        new_group = self.fleet.group is None or (bool(self.missed) and self.fleet.rejoin_due())
        if new_group:
            self.connect()
        manifest = self._plan(tensors, version)  # after connect: pieces follow the members
        probe_due = new_group or self._probe_always or self._num_pushes % self.probe_every == 0
        retried = False
        try:
            check, replies = self._attempt(manifest, tensors, state, model, probe_due)
        except TrainerReplaced as replaced:
            if not self.take_over:
                self._replaced = replaced
                raise
            logger.warning(
                "weight push of version %d: taking the server(s) back from another trainer "
                "(take_over=True): %s",
                version,
                replaced,
            )
            self.connect()
            retried = True
            manifest = self._plan(tensors, version)
            check, replies = self._attempt(manifest, tensors, state, model, True)
        except PushFailed as failure:  # a server died or broke the group: redo it over a fresh one
            left = isinstance(failure, ServerLeftGroup)
            if not left:
                logger.warning("weight push of version %d failed: %s; retrying", version, failure)
            self.connect()
            if left:
                logger.warning(
                    "weight push of version %d: rejoined %s to the weight-sync group (a new "
                    "/init and join) and retrying the push once, because %s",
                    version,
                    ", ".join(failure.failed),
                    failure,
                )
            retried = True
            manifest = self._plan(tensors, version)
            try:
                check, replies = self._attempt(manifest, tensors, state, model, True)
            except PushFailed as again:
                self.missed.update(again.failed)
                if left:
                    raise WeightPushError(
                        f"weight push of version {version} failed again after rejoining the "
                        f"weight-sync group once (first: {failure}): {again}"
                    ) from again
                self.fleet.require(0, "take the push")
                raise  # unreachable: require raised (min_servers >= 1)
        transferred = time.perf_counter()
        self._num_pushes += 1
        if self.verify:
            self._verifier.verify_all(self.fleet, version, replies, tensors, check, atol=self.atol)
        self._report_missed(version, len(replies))
        first = next(iter(replies.values()))
        self.last_push = PushStats(
            version=version,
            num_bytes=manifest.total_bytes,
            num_buckets=len(manifest.buckets),
            transfer_seconds=transferred - started,
            verify_seconds=time.perf_counter() - transferred,
            held_checksums=first.get("checksums"),
            held_totals=first.get("held_totals"),
            servers=tuple(replies),
            missed=dict(self.missed),
            retried=retried,
        )

    def _attempt(
        self,
        manifest: WeightManifest,
        tensors: dict[str, torch.Tensor],
        state: Mapping[str, torch.Tensor],
        model: torch.nn.Module | None,
        probe_due: bool,
    ) -> tuple[PushCheck, dict[str, dict[str, Any]]]:
        """One push to the current group; each server's reply by URL. Raises PushFailed (the
        group is dropped) when a server failed during it."""
        check = PushCheck()
        running = RunningChecksums()  # finite: checked before sending
        casts = self._expected_casts(tensors)  # dtype -> the tensors a server holds in it
        cast_running = {dtype: RunningChecksums() for dtype in casts}

        def on_sent(progress: list[tuple[str, torch.Tensor, int]]) -> None:  # beside the wire
            for name, tensor, upto in progress:  # each piece just read by the transport
                running.advance(name, tensor, upto)
                for dtype, names in casts.items():
                    if name in names:
                        cast_running[dtype].advance(name, tensor, upto, dtype=dtype)

        def while_the_servers_load() -> None:  # overlaps the servers' load and checksums
            if self.verify and self.probe and probe_due:
                self._verifier.take_probe(check, model, state)

        try:
            self.fleet.request_push(manifest)
            self.fleet.send(manifest, tensors, self._pool, on_sent if self.verify else None)
            check.sent = running.finish()[0]
            check.sent_cast = {dtype: r.finish()[0] for dtype, r in cast_running.items()}
            while_the_servers_load()
            return check, self.fleet.replies()
        except (PushFailed, TrainerReplaced):
            self.fleet.drop()  # a failed collective leaves the group unusable
            raise

    def _report_missed(self, version: int, took: int) -> None:
        for url, why in self.missed.items():
            logger.warning("weight push of version %d did not reach %s: %s", version, url, why)
        self.fleet.require(took, "take the push")

    def _expected_casts(self, tensors: Mapping[str, torch.Tensor]) -> dict[torch.dtype, set[str]]:
        if not self.verify:
            return {}
        return expected_casts(tensors, [server.served_dtype for server in self.fleet.members])

    def _full_state_dict(self, weights: Weights) -> Mapping[str, torch.Tensor]:
        """The unsharded state dict (the module tree is walked again only when it changed)."""
        if not isinstance(weights, torch.nn.Module):
            return weights
        from torch.distributed.tensor import DTensor

        if self._live is None or self._live.model is not weights:
            self._live = LiveStateDict(weights)
        state = self._live()
        if any(isinstance(t, DTensor) for t in state.values()):
            return gather_full_state_dict(weights)
        return state

    def _plan(self, tensors: dict[str, torch.Tensor], version: int) -> WeightManifest:
        """The manifest for `tensors` (`PlanCache`: the last plan while the layout holds). An
        unverified push asks the server for no checksums (a new plan when that flips)."""
        return self._plans.plan(
            tensors,
            version,
            checksums=self.verify,
            bucket_bytes=self.bucket_bytes,
            alone_bytes=self.alone_bytes,
            piece_bytes=self._piece_bytes(),
        )

    def _piece_bytes(self) -> int:
        """`piece_mb` in bytes when every server in the group says (`"pieces": true` in its
        status) that it receives buckets in pieces; else 0 (whole buckets): an older server
        ignores `piece_bytes` and would post one broadcast per bucket, out of step with us."""
        if not self.piece_bytes:
            return 0
        whole = [s.url for s in self.fleet.members if not s.pieces]
        if not whole:
            return self.piece_bytes
        if not self._warned_whole:
            logger.warning(
                "%s do not receive buckets in pieces (older servers): sending whole buckets "
                "(piece_mb has no effect until every server is upgraded)",
                whole,
            )
            self._warned_whole = True
        return 0

    def _rank(self) -> int:
        if self.rank is not None:
            return self.rank
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
