"""The servers a `BroadcastPolicyPublisher` pushes to, as one weight-sync group: which of them
are in it (`members`) and which are left out (`missed`, with why), building the group on a
fresh trainer-hosted store, and driving one push through it (manifest or `/start` to each,
the bucket broadcast, each server's reply). A server that cannot be reached, dies or fails
mid-push raises `PushFailed` naming it; the group is then unusable and is dropped. A server
that refuses a push it received whole (a 4xx: e.g. 422, weights holding nan) raises
`PushRefused` (a `WeightPushError` and a refusal naming each server, its HTTP status, its words
and what to do), not retried, once every member has answered (the group stays usable). A
server that answers `/start` with a 4xx saying it has no communicator (it is not in this
trainer's group any more: it restarted and forgot it) raises `ServerLeftGroup`, a
`PushFailed`: the publisher rejoins and retries once. A server that says another trainer
replaced this one's group (another trainer joined it) raises `TrainerReplaced`, a
`WeightPushError` naming that trainer, and the group is dropped: rejoining would take the
server back from the other trainer (only a publisher allowed to `take_over` does). Every
request carries the trainer's identity (`/init`) or the group id the server gave it, so a
close from this trainer never frees another trainer's group. It does not verify what the
servers hold (the publisher does).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import httpx
import torch

from ludic.distributed.control import ServerGone, StoreControl
from ludic.distributed.manifest import WeightManifest
from ludic.distributed.server_link import (
    PushRefused,
    Refused,
    ServerLink,
    ServerUnreachable,
    TooFewServers,
    TrainerReplaced,
    WeightPushError,
)
from ludic.distributed.transfer import (
    Backend,
    BufferPool,
    Collective,
    Progress,
    host_store,
    open_group,
    send_buckets,
)

logger = logging.getLogger(__name__)


class PushFailed(Exception):
    """Servers that failed during one attempt at a push (URL -> why)."""

    def __init__(self, failed: dict[str, str]) -> None:
        super().__init__("; ".join(failed.values()))
        self.failed = failed


class ServerLeftGroup(PushFailed):
    """Servers that answered a push saying they are not in this trainer's group (URL -> why):
    rebuilding the group (a new /init and join to each) brings them back."""


# What a server's refusal of /start says when it holds no group (the embedded server and the
# vLLM extension: "no communicator: POST /ludic/weights/init first").
_NOT_IN_GROUP = ("no communicator", "not joined")


class ServerGroup:
    """`servers` as one group with this trainer as rank 0 (see the module docstring);
    `min_servers`: fewer servers taking a push fail it (`require`)."""

    def __init__(
        self,
        servers: Sequence[ServerLink],
        *,
        backend: Backend,
        master_addr: str,
        timeout_s: float,
        control: Literal["auto", "http", "store"],
        min_servers: int,
    ) -> None:
        if not 1 <= min_servers <= len(servers):
            raise ValueError(
                f"min_servers must be between 1 and the number of servers "
                f"({len(servers)}), got {min_servers}"
            )
        self.servers = list(servers)
        trainer = {"id": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
        for server in self.servers:  # one identity for this trainer on every server
            server.trainer = trainer
        self.backend: Backend = backend
        self.master_addr = master_addr
        self.timeout_s = timeout_s
        self.control = control
        self.min_servers = min_servers
        self.group: Collective | None = None
        self.store: Any = None  # rank 0 hosts it; it must outlive the group
        self.members: list[ServerLink] = []  # the servers in the current group
        self.missed: dict[str, str] = {}  # servers left out of the group (URL -> why)

    def connect(self, left_out: dict[str, str] | None = None) -> None:
        """Host a fresh store, ask every reachable server to join, build the group (blocks
        until all have joined). Servers that cannot be reached are left out (`missed`)."""
        self.drop()
        members, missed, offered = [], dict(left_out or {}), {}
        for server in self.servers:
            if server.url in missed:
                continue
            try:
                offered[server.url] = server.status().get("controls", ["http"])
                members.append(server)
            except ServerUnreachable as e:  # a refusal (bad token) is raised, not skipped
                missed[server.url] = str(e)
        self.missed = missed
        if not members:  # a push to the others still goes ahead below min_servers, then fails
            self.require(0, "be reached")
        for server in members:  # before any /init: a server asked to join would wait in vain
            server.control_for(self.control, offered[server.url])
        world_size = 1 + sum(s.ranks for s in members)
        store = host_store(self.master_addr, 0, world_size=world_size, timeout_s=self.timeout_s)
        first_rank = 1
        for server in members:
            try:
                server.join(
                    host=self.master_addr,
                    port=int(store.port),
                    backend=self.backend,
                    world_size=world_size,
                    first_rank=first_rank,
                    timeout_s=self.timeout_s,
                    control=self.control,
                    offered=offered[server.url],
                )
            except ServerUnreachable as e:  # gone since its status: build it without
                return self.connect({**missed, server.url: str(e)})
            first_rank += server.ranks
        try:
            group = open_group(
                store, rank=0, world_size=world_size, backend=self.backend, timeout_s=self.timeout_s
            )
        except RuntimeError as e:
            gone = {s.url: r for s in members if (r := s.why_gone()) is not None}
            raise WeightPushError(
                f"the servers did not all join the weight-sync group ({e}); {gone or ''}"
            ) from e
        self.group, self.store, self.members = group, store, members
        for server in members:
            if server.control == "store":
                server.channel = StoreControl(store, rank=server.first_rank)

    def close(self) -> None:
        """Drop the group and tell the servers (best effort)."""
        if self.group is not None:
            for server in self.members:
                try:
                    if server.channel is not None:
                        server.channel.send_close()  # the server stops waiting on our store
                    server.request("POST", "/ludic/weights/close", json=server.scoped())
                except (httpx.HTTPError, WeightPushError, RuntimeError) as e:
                    logger.warning("could not close the server's weight-sync group: %s", e)
        self.drop()

    def drop(self) -> None:
        """Forget the group. Freeing it closes its connections at once (`abort()` would not),
        so a server still waiting on a broadcast from this trainer fails now, not at its
        timeout."""
        for server in self.members:
            server.leave()
        self.group, self.store, self.members = None, None, []

    def require(self, took: int, what: str) -> None:
        """Fewer than `min_servers` took part (`took`): TooFewServers, a refusal naming each
        server missed and what to do."""
        if took < self.min_servers:
            named = "; ".join(f"{url}: {why}" for url, why in self.missed.items())
            raise TooFewServers(
                f"{took} of {len(self.servers)} servers could {what} (min_servers="
                f"{self.min_servers}): {named or 'none answered'}. Start each server named "
                "again (`ludic serve`; its own log says why it stopped) and rerun this command: "
                "a run that saved checkpoints resumes from its last one"
            )

    def rejoin_due(self) -> bool:
        """A server left out answers again (e.g. it restarted): rebuild the group with it."""
        return any(self._came_back(s) for s in self.servers if s.url in self.missed)

    @staticmethod
    def _came_back(server: ServerLink) -> bool:
        try:
            server.status(timeout_s=2.0)
        except WeightPushError:
            return False
        return True

    def request_push(self, manifest: WeightManifest) -> None:
        """Send the manifest to every member; wait for the acks of a new layout. A server that
        refuses it fails the push (PushRefused); one that is gone raises PushFailed."""
        awaiting = []
        for server in self.members:
            if server.channel is None:
                self._start(server, manifest)
            elif server.channel.send_manifest(manifest):  # a new layout: wait for the ack
                awaiting.append(server)
        for server in awaiting:
            assert server.channel is not None
            try:
                ack = server.channel.wait_reply(
                    "ack", alive=server.why_gone, timeout_s=self.timeout_s
                )
            except (ServerGone, RuntimeError) as e:
                self.raise_if_replaced()
                raise PushFailed({server.url: str(e)}) from e
            if "error" in ack:  # refused before any byte
                if len(self.members) > 1:  # the others wait for buckets that will not come
                    self.drop()
                said, status = str(ack["error"]), ack.get("status")
                raise PushRefused([Refused(url=server.url, what="push", status=status, said=said)])

    def _start(self, server: ServerLink, manifest: WeightManifest) -> None:
        """`POST /ludic/weights/start`; a server that refuses it because it holds no group
        (or, asked, says it is not in one) raises ServerLeftGroup, any other refusal
        PushRefused."""
        try:
            body = server.scoped(manifest.to_json())
            if server.store_at is not None:  # the server refuses it if it holds another group
                body["store"] = server.store_at
            self._call(server, "POST", "/ludic/weights/start", body)
        except PushFailed:
            raise
        except WeightPushError as e:
            if server.refused_as_replaced(e):
                self.raise_if_replaced()
            said = e.said if isinstance(e, PushRefused) else str(e)  # not a refusal's advice
            left = any(m in said.lower() for m in _NOT_IN_GROUP) or server.why_gone() is not None
            if not left:
                raise
            raise ServerLeftGroup(
                {
                    server.url: f"{said} (it is no longer in this trainer's weight-sync group: "
                    "another trainer joined it and closed the group, or it restarted)"
                }
            ) from e

    def replies(self) -> dict[str, dict[str, Any]]:
        """Each member's reply once it has loaded the push; PushFailed names the first that
        failed. Servers that refused the push (a 4xx: they received it whole, the group still
        works) raise PushRefused naming them once every member has answered (so each
        one's push is over: the next one starts in step); a refusal is not retried."""
        replies: dict[str, dict[str, Any]] = {}
        refused: list[Refused] = []
        for server in self.members:
            try:
                if server.channel is None:
                    reply = self._call(server, "POST", "/ludic/weights/finish", server.scoped())
                else:
                    reply = server.channel.wait_reply(
                        "done", alive=server.why_gone, timeout_s=self.timeout_s
                    )
            except PushFailed:
                raise  # the push is redone over a fresh group: waiting for the rest is moot
            except PushRefused as e:  # /finish answered with a 4xx
                if server.refused_as_replaced(e):
                    self.raise_if_replaced()
                refused += e.refusals
                continue
            except (ServerGone, RuntimeError) as e:  # RuntimeError: the store itself failed
                self.raise_if_replaced()
                raise PushFailed({server.url: str(e)}) from e
            if "error" in reply and server.refused_as_replaced(RuntimeError(reply["error"])):
                self.raise_if_replaced()
            if "error" in reply:
                status = reply.get("status")
                if isinstance(status, int) and 400 <= status < 500:
                    said = str(reply["error"])
                    refused.append(Refused(url=server.url, what="push", status=status, said=said))
                    continue
                why = f"server {server.url}: push failed ({status}): {reply['error']}"
                raise PushFailed({server.url: why})
            replies[server.url] = reply
        if refused:
            raise PushRefused(refused)
        return replies

    def _call(self, server: ServerLink, method: str, path: str, json: Any = None) -> dict[str, Any]:
        """An HTTP-control request; a server that cannot be reached or fails it raises
        PushFailed (5xx, unreachable), one that refuses it PushRefused (4xx)."""
        try:
            return server.request(method, path, json=json)
        except ServerUnreachable as e:
            raise PushFailed({server.url: str(e)}) from e

    def send(
        self,
        manifest: WeightManifest,
        tensors: dict[str, torch.Tensor],
        pool: BufferPool,
        on_sent: Progress | None = None,
    ) -> None:
        """Broadcast the buckets to the group (`on_sent`: see `send_buckets`); PushFailed names
        who is gone if it fails."""
        assert self.group is not None
        try:
            send_buckets(self.group, manifest, tensors, pool=pool, on_sent=on_sent)
            return
        except Exception as e:
            why = f"broadcasting weights failed: {type(e).__name__}: {e}"
        # Raised out here, not from the except: its traceback would hold the group, and the
        # group must be freed for the servers still waiting on it to fail at once.
        gone = {s.url: r for s in self.members if (r := s.why_gone()) is not None}
        self.raise_if_replaced()
        raise PushFailed(gone or {s.url: why for s in self.members})

    def raise_if_replaced(self) -> None:
        """Raise TrainerReplaced naming each member that said another trainer replaced this
        one's group there."""
        named = {s.url: s.replaced for s in self.members if s.replaced is not None}
        if named:
            raise TrainerReplaced("; ".join(f"server {url}: {why}" for url, why in named.items()))


def links(
    base_url: str | Sequence[str],
    token: str,
    server_ranks: int | Sequence[int],
    timeout_s: float,
    http: httpx.Client | Sequence[httpx.Client] | None,
) -> list[ServerLink]:
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls:
        raise ValueError("BroadcastPolicyPublisher needs at least one server URL")
    if len(set(urls)) != len(urls):
        raise ValueError(f"a server URL is given twice: {urls}")
    ranks = [server_ranks] * len(urls) if isinstance(server_ranks, int) else list(server_ranks)
    several = isinstance(http, (list, tuple))
    clients = list(http) if several else [http] * len(urls)  # type: ignore[arg-type]
    if len(ranks) != len(urls) or len(clients) != len(urls):
        raise ValueError(
            f"{len(urls)} server URLs need one server_ranks and one http client each, got "
            f"{len(ranks)} and {len(clients)}"
        )
    if http is not None and not several and len(urls) > 1:
        raise ValueError("one http client cannot talk to several servers: pass one per URL")
    return [
        ServerLink(url, token, ranks=r, timeout_s=timeout_s, http=c)  # type: ignore[arg-type]
        for url, r, c in zip(urls, ranks, clients, strict=True)
    ]
