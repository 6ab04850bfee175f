"""`BroadcastPolicyPublisher`: pushes trainer weights to an inference server over a
`torch.distributed` data plane, then verifies the server serves them.

One push: send the manifest (names, shapes, dtypes, buckets, version), wait for the server to
accept it, broadcast the buckets over the standalone group (trainer = rank 0, server = rank 1),
wait for the server's reply (it loads the weights and reports its version), then check
`/ludic/version` and a logprob probe against the trainer's own model. The manifest and replies
travel as keys in the trainer's TCPStore when the server offers that (`control="store"`, the
embedded server: no HTTP request per push, `ludic.distributed.control`), else as POST
`/ludic/weights/start` and `/finish` (the vLLM extension); joining, status and the probe use
HTTP either way. The server side is `ludic.inference.http.weight_receiver`. Under FSDP either call
`publish` with the sharded model on every rank (the full state dict is gathered, a collective;
rank 0 pushes, the other ranks return) or, as the Trainer does, gather first and call it on
rank 0 with the state dict; verification never runs a collective. It talks to one server;
publish to several with one publisher each.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import torch
import torch.distributed as dist

from ludic.distributed.checksum import (
    Checksum,
    cast_for,
    checksums,
    fold_totals,
    held_name,
    mismatched,
    nonfinite,
)
from ludic.distributed.control import StoreControl
from ludic.distributed.interfaces import Weights
from ludic.distributed.live_state import LiveStateDict
from ludic.distributed.manifest import TensorEntry, WeightManifest, plan_manifest
from ludic.distributed.transfer import (
    Backend,
    BufferPool,
    Collective,
    host_store,
    open_group,
    send_buckets,
)
from ludic.distributed.verification import (
    HttpPolicyProbe,
    check_served_policy,
    default_probe_tokens,
    probe_atol,
    trainer_logprobs,
    vocab_size_of,
)

logger = logging.getLogger(__name__)


class WeightPushError(RuntimeError):
    """The server refused or failed a push (the message carries its explanation)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PushStats:
    """Timings and sizes of the last push (seconds)."""

    version: int
    num_bytes: int
    num_buckets: int
    transfer_seconds: float
    verify_seconds: float
    held_checksums: dict[str, list[int]] | None = None
    """What the server reported holding after the load (name -> checksum), when it did."""
    held_totals: list[dict[str, list[Any]]] | None = None
    """A fusing server's (vLLM's) report instead: per rank, parameter -> [total, numel, dtype]
    in its own layout (fused, sharded, vocab padded)."""


@dataclass(slots=True)
class _Check:
    """What one push is verified against, computed while the server loads."""

    sent: dict[str, Checksum] = dataclasses.field(default_factory=dict)
    nonfinite: list[str] = dataclasses.field(default_factory=list)
    probe_ids: list[int] | None = None
    expected: list[float] | None = None


class BroadcastPolicyPublisher:
    """Publishes to the server at `base_url` whose control endpoints take bearer `token`.

    - `backend`: "gloo" (CPU tensors) or "nccl" (tensors on `device`, a CUDA device).
    - `bucket_mb`, `pack_below_mb`: tensors smaller than `pack_below_mb` are packed into
      broadcasts of at most `bucket_mb`; larger ones are broadcast alone, in place (no copy).
    - `wire_dtype`: cast floating tensors before sending (e.g. bfloat16 for a bf16 server).
    - `verify`: after each push, check the version the server reports, exact checksums of
      every tensor the server holds after loading against the sent ones (a skipped tensor, a
      load that never happened, a dropped tiny update), and that the sent weights are finite.
      With `probe`, also on the first push of each connection and every `probe_every`-th
      push: the server's `/ludic/logprobs` on `probe_token_ids` (default: 16 fixed
      pseudo-random ids) against the trainer's within `atol` for a full-precision server,
      widened for a half-precision one (`verification.PROBE_ATOL`: 0.05 float16, 0.2
      bfloat16, from the dtype the server reports); nan or inf logprobs always fail. The probe checks the server's numerics (its forward, dtype, config), which
      do not change between pushes, and costs two forward passes, more than the whole
      transfer of a small model on a CPU: `probe_every=1` probes every push. The trainer's
      logprobs come from the published model, or, when `publish` gets a state dict (as the
      Trainer passes), from `probe_model` (the model that state came from; with LoRA its
      forward matches the merged weights). When that model is sharded (FSDP2) its forward
      would be a collective on rank 0 alone, so the reference runs on a non-sharded twin
      holding the gathered state instead (no other rank is involved). Without a model only
      the server's logprobs are checked for being finite (a warning says so once).
    - `control`: how pushes are driven: "store" (manifest and replies as keys in the trainer's
      TCPStore), "http" (`/start` and `/finish` requests), "auto" (store when the server
      offers it in `/ludic/weights/status`).
    - `server_ranks`: receiving ranks on the server side (vLLM with tensor parallelism: TP).
    - `master_addr`: this trainer's address as the server sees it (it hosts the TCPStore).
    - `rank`: this process's trainer rank (default: the default group's rank, else 0).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        backend: Backend = "gloo",
        bucket_mb: float = 64.0,
        pack_below_mb: float = 1.0,
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
        server_ranks: int = 1,
        control: Literal["auto", "http", "store"] = "auto",
        http: httpx.Client | None = None,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (GPU), got {backend!r}")
        if bucket_mb <= 0 or pack_below_mb <= 0:
            raise ValueError(
                f"bucket_mb and pack_below_mb must be > 0: {bucket_mb}, {pack_below_mb}"
            )
        if control not in ("auto", "http", "store"):
            raise ValueError(f"control must be 'auto', 'http' or 'store', got {control!r}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        if server_ranks < 1:
            raise ValueError(f"server_ranks must be >= 1, got {server_ranks}")
        if probe_token_ids is not None and len(probe_token_ids) < 2:
            raise ValueError("probe_token_ids needs at least 2 tokens (a prefix and a target)")
        self.backend: Backend = backend
        self.bucket_bytes = max(1, int(bucket_mb * 2**20))
        self.alone_bytes = max(1, int(pack_below_mb * 2**20))
        self.device = torch.device(device or ("cuda" if backend == "nccl" else "cpu"))
        self._pool = BufferPool(self.device)  # packing buffers, kept across pushes
        self.wire_dtype = wire_dtype
        self.verify = verify
        self.probe = probe
        self.probe_every = probe_every
        self._num_pushes = 0
        self.server_ranks = server_ranks
        self.probe_token_ids = None if probe_token_ids is None else list(probe_token_ids)
        self.probe_model = probe_model
        self._warned_no_probe = False
        self._warned_unverified = False
        # Set once the server holds sent tensors it cannot checksum (vLLM's CPU backend packs
        # linear weights into kernel handles): the probe is then their only check, every push.
        self._probe_always = False
        self._served_dtype: str | None = None  # from the server's status: sets the probe atol
        self.atol = atol
        self.master_addr = master_addr
        self.timeout_s = timeout_s
        self.rank = rank
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout_s)
        self.http.headers["Authorization"] = f"Bearer {token}"
        self.control = control
        self._group: Collective | None = None
        self._store: Any = None  # rank 0 hosts it; it must outlive the group
        self._channel: StoreControl | None = None  # set when pushes go through the store
        self._last_plan: tuple[list[Any], WeightManifest] | None = None
        self._live: LiveStateDict | None = None  # the last published module's state dict
        self.last_push: PushStats | None = None

    # -- connection ---------------------------------------------------------------------

    def connect(self) -> None:
        """Host the store, ask the server to join, build the group (blocks until joined)."""
        status = self._request("GET", "/ludic/weights/status")  # fails fast on a bad URL/token
        offered = status.get("controls", ["http"])
        self._served_dtype = status.get("dtype")
        control = self.control
        if control == "auto":
            control = "store" if "store" in offered else "http"
        elif control not in offered:
            raise WeightPushError(f"the server offers control {offered}, not {control!r}")
        world_size = 1 + self.server_ranks
        store = host_store(self.master_addr, 0, world_size=world_size, timeout_s=self.timeout_s)
        body = {
            "host": self.master_addr,
            "port": int(store.port),
            "backend": self.backend,
            "world_size": world_size,
            "timeout_s": self.timeout_s,
        }
        if control == "store":  # sent only then: HTTP-driven servers see the request as before
            body["control"] = "store"
        self._request("POST", "/ludic/weights/init", json=body)
        self._group = open_group(
            store, rank=0, world_size=world_size, backend=self.backend, timeout_s=self.timeout_s
        )
        self._store = store
        if control == "store":
            self._channel = StoreControl(store)

    def close(self) -> None:
        """Drop the group and tell the server (best effort)."""
        if self._group is not None:
            try:
                if self._channel is not None:
                    self._channel.send_request({"close": True})
                self._request("POST", "/ludic/weights/close")
            except (httpx.HTTPError, WeightPushError, RuntimeError) as e:
                logger.warning("could not close the server's weight-sync group: %s", e)
        self._drop_group()

    def _drop_group(self) -> None:
        self._group, self._store, self._channel = None, None, None

    # -- publishing ---------------------------------------------------------------------

    def publish(self, weights: Weights, *, version: int) -> None:
        """Push `weights` as policy `version` and verify; raises PublishVerificationError if the
        server does not serve them, WeightPushError if it refused or failed the push."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"publish: version must be an int >= 0, got {version!r}")
        model = weights if isinstance(weights, torch.nn.Module) else self.probe_model
        state = self._full_state_dict(weights)  # a collective under FSDP: every rank calls it
        if self._rank() != 0:
            return  # nothing below is a collective: the probe runs on a non-sharded twin
        if self.verify and self.probe and model is None and not self._warned_no_probe:
            logger.warning(
                "publishing a state dict without probe_model: the served weights are checked "
                "(checksums) but not the server's forward (pass probe_model=<the trainer's model>)"
            )
            self._warned_no_probe = True
        started = time.perf_counter()
        tensors = self._wire_tensors(state)
        manifest = self._plan(tensors, version)
        probe_due = (
            self._group is None or self._probe_always or self._num_pushes % self.probe_every == 0
        )
        if self._group is None:
            self.connect()
        check = _Check()

        def while_sending(entries: list[TensorEntry]) -> None:  # overlaps the transfer
            if self.verify:
                sent = {e.name: tensors[e.name] for e in entries}
                check.sent.update(checksums(sent))
                check.nonfinite += nonfinite(sent)

        def while_the_server_loads() -> None:  # overlaps the server's load and checksums
            if self.verify and self.probe and probe_due:
                check.probe_ids = self._probe_ids(model) if model is not None else None
                if check.probe_ids is None:
                    check.probe_ids = self._probe_ids_from_state(state)
                elif model is not None:
                    check.expected = trainer_logprobs(model, state, check.probe_ids)

        if self._channel is not None:
            reply = self._push_via_store(
                self._channel, manifest, tensors, while_sending, while_the_server_loads
            )
        else:
            self._request("POST", "/ludic/weights/start", json=manifest.to_json())
            self._send(manifest, tensors, while_sending)
            while_the_server_loads()
            reply = self._request("POST", "/ludic/weights/finish")
        transferred = time.perf_counter()
        self._num_pushes += 1
        if self.verify:
            self._verify(version, reply, tensors, check)
        self.last_push = PushStats(
            version=version,
            num_bytes=manifest.total_bytes,
            num_buckets=len(manifest.buckets),
            transfer_seconds=transferred - started,
            verify_seconds=time.perf_counter() - transferred,
            held_checksums=reply.get("checksums"),
            held_totals=reply.get("held_totals"),
        )

    def _probe_ids_from_state(self, state: Mapping[str, torch.Tensor]) -> list[int]:
        """Probe tokens without a model: in the vocabulary of the embedding (a finite check)."""
        if self.probe_token_ids is None:
            rows = [t.shape[0] for n, t in state.items() if n.endswith("embed_tokens.weight")]
            self.probe_token_ids = default_probe_tokens(rows[0] if rows else 2)
        return self.probe_token_ids

    def _push_via_store(
        self,
        channel: StoreControl,
        manifest: WeightManifest,
        tensors: dict[str, torch.Tensor],
        while_sending: Callable[[list[TensorEntry]], None],
        while_waiting: Callable[[], None],
    ) -> dict[str, Any]:
        try:
            if channel.send_manifest(manifest):  # a new layout: wait for the ack
                ack = channel.wait_reply("ack")
                if "error" in ack:  # refused before any byte: the group is still usable
                    raise WeightPushError(f"push refused ({ack.get('status')}): {ack['error']}")
            self._send(manifest, tensors, while_sending)
            while_waiting()
            done = channel.wait_reply("done")
        except WeightPushError:
            raise
        except RuntimeError as e:  # the store: the server is gone or stuck
            self._drop_group()
            raise WeightPushError(f"the server did not answer the push: {e}") from e
        if "error" in done:
            self._drop_group()
            raise WeightPushError(f"push failed ({done.get('status')}): {done['error']}")
        return done

    def _send(
        self,
        manifest: WeightManifest,
        tensors: dict[str, torch.Tensor],
        while_sending: Callable[[list[TensorEntry]], None] | None = None,
    ) -> None:
        assert self._group is not None
        try:
            send_buckets(
                self._group, manifest, tensors, pool=self._pool, while_sending=while_sending
            )
        except Exception as e:
            self._drop_group()  # a failed collective leaves the group unusable: reconnect next
            raise WeightPushError(f"broadcasting weights failed: {type(e).__name__}: {e}") from e

    def _verify(
        self,
        version: int,
        reply: Mapping[str, Any],
        tensors: dict[str, torch.Tensor],
        check: _Check,
    ) -> None:
        probe = HttpPolicyProbe(self.http)
        served_version = probe.served_version()
        finished_version = int(reply["policy_version"])
        if finished_version != version:  # the load itself reported another version
            served_version = finished_version
        mismatched, unverified = self._compare_held(reply, tensors, check.sent)
        served = probe.served_logprobs(check.probe_ids) if check.probe_ids is not None else None
        check_served_policy(
            version=version,
            served_version=served_version,
            expected_logprobs=check.expected,
            served_logprobs=served,
            atol=probe_atol(self._served_dtype, default=self.atol),
            mismatched_tensors=mismatched,
            unverified=unverified,
            nonfinite_tensors=check.nonfinite,
        )

    def _compare_held(
        self,
        reply: Mapping[str, Any],
        tensors: dict[str, torch.Tensor],
        sent: dict[str, Checksum] | None,
    ) -> tuple[list[str], str | None]:
        """The tensors whose checksum on the server differs from the sent one, and why the
        comparison could not be made (None when it was)."""
        if "checksums" in reply and sent is not None:
            held_dtypes = dict(reply.get("held_dtypes") or {})
            if held_dtypes:  # the server holds some in another dtype: compare the cast
                sent = {**sent, **checksums(tensors, cast_to=cast_for(tensors, held_dtypes))}
            return mismatched(sent, reply["checksums"]), None
        if "held_totals" in reply:  # a server that fuses and shards (vLLM)
            return self._compare_folded(reply, tensors)
        return [], (
            "the server did not report checksums of the weights it holds, so the load cannot "
            "be verified (upgrade the server, or pass verify=False)"
        )

    def _compare_folded(
        self, reply: Mapping[str, Any], tensors: dict[str, torch.Tensor]
    ) -> tuple[list[str], str | None]:
        held_by_rank: list[dict[str, list[Any]]] = list(reply["held_totals"])
        packed = dict(reply.get("packed_modules_mapping") or {})
        dtypes = {
            name: str(entry[2])
            for held in held_by_rank
            for name, entry in held.items()
            if len(entry) > 2
        }
        casts = {n: dtypes[held_name(n, packed)] for n in tensors if held_name(n, packed) in dtypes}
        totals = checksums(tensors, cast_to=cast_for(tensors, casts))
        sent = {n: (totals[n][0] & 0xFFFFFFFF, t.numel()) for n, t in tensors.items()}
        held = [{n: [int(e[0]), int(e[1])] for n, e in h.items()} for h in held_by_rank]
        result = fold_totals(sent, held, packed)
        if not result.num_checked:
            return [], "no tensor the server holds matches a sent name: cannot verify the load"
        opaque = set(reply.get("opaque") or ())
        packed_away = [n for n in result.unverified if held_name(n, packed) in opaque]
        if packed_away:
            self._probe_always = True  # the probe is their only check: run it on every push
        if result.unverified and not self._warned_unverified:
            logger.warning(
                "%d sent tensors cannot be verified by checksum (%d held only inside the "
                "server's kernels, e.g. vLLM's CPU backend packs linear weights; the rest have "
                "no counterpart on the server), e.g. %s: the logprob probe checks them, on "
                "every push",
                len(result.unverified),
                len(packed_away),
                list(result.unverified[:3]),
            )
            self._warned_unverified = True
        return list(result.mismatched), None

    def _full_state_dict(self, weights: Weights) -> Mapping[str, torch.Tensor]:
        """The unsharded state dict (the module tree is walked again only when it changed)."""
        if not isinstance(weights, torch.nn.Module):
            return weights
        from torch.distributed.tensor import DTensor

        if self._live is None or self._live.model is not weights:
            self._live = LiveStateDict(weights)
        state = self._live()
        if any(isinstance(t, DTensor) for t in state.values()):
            return _gather_full_state_dict(weights)
        return state

    def _probe_ids(self, model: torch.nn.Module) -> list[int]:
        if self.probe_token_ids is None:
            self.probe_token_ids = default_probe_tokens(vocab_size_of(model))
        return self.probe_token_ids

    def _plan(self, tensors: dict[str, torch.Tensor], version: int) -> WeightManifest:
        """The manifest for `tensors`; the last plan (new version) when names, shapes and
        dtypes are unchanged, as they are from one training step to the next."""
        signature = [(name, t.shape, t.dtype) for name, t in tensors.items()]
        if self._last_plan is None or self._last_plan[0] != signature:
            plan = plan_manifest(
                tensors,
                version=version,
                bucket_bytes=self.bucket_bytes,
                alone_bytes=self.alone_bytes,
            )
            self._last_plan = (signature, plan)
        return dataclasses.replace(self._last_plan[1], version=version)

    def _wire_tensors(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        tensors = {}
        for name, tensor in state.items():
            t = tensor.detach()
            if self.wire_dtype is not None and t.is_floating_point():
                t = t.to(self.wire_dtype)
            tensors[name] = t.to(self.device).contiguous()
        return tensors

    def _rank(self) -> int:
        if self.rank is not None:
            return self.rank
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def _request(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        try:
            response = self.http.request(method, path, json=json)
        except httpx.HTTPError as e:
            raise WeightPushError(f"{method} {path}: cannot reach the server: {e}") from e
        if response.status_code != 200:
            raise WeightPushError(
                f"{method} {path} failed ({response.status_code}): {response.text[:500]}"
            )
        body: dict[str, Any] = response.json()
        return body


def _gather_full_state_dict(model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
    """The unsharded state dict of an FSDP2 model: a collective that leaves it on rank 0 only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full: dict[str, Any] = get_model_state_dict(model, options=options)
    return {name: value for name, value in full.items() if isinstance(value, torch.Tensor)}
