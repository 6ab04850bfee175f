"""`PushVerifier`: how `BroadcastPolicyPublisher` checks each server that took a push: the
version it reports, exact checksums of every tensor it holds against the sent ones, and, when a
probe is due, its logprobs on a few probe tokens against the trainer's. It remembers what the
checks learn across pushes (the probe tokens; a server holding tensors no checksum can reach,
whose only check is then the probe, on every push).

It sends nothing, decides nothing about retries or missed servers beyond naming one that died
after its reply, and never runs a collective (the trainer's reference forward runs on a
non-sharded twin: `verification.trainer_logprobs`). Warnings go to `ludic.distributed.broadcast`'s
logger, as before the split.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import torch

from ludic.distributed.held_check import compare_held
from ludic.distributed.interfaces import PublishVerificationError
from ludic.distributed.push_records import PushCheck
from ludic.distributed.server_group import ServerGroup
from ludic.distributed.server_link import ServerLink
from ludic.distributed.verification import (
    check_pushed_server,
    default_probe_tokens,
    probe_atol,
    trainer_logprobs,
    vocab_size_of,
)

logger = logging.getLogger("ludic.distributed.broadcast")

__all__ = ["PushVerifier"]


class PushVerifier:
    """Verifies pushes on the probe tokens `probe_token_ids` (default: 16 fixed pseudo-random
    ids in the model's vocabulary, chosen at the first probe)."""

    def __init__(self, probe_token_ids: Sequence[int] | None = None) -> None:
        self.probe_token_ids = None if probe_token_ids is None else list(probe_token_ids)
        # Set once a server holds sent tensors it cannot checksum (vLLM's CPU backend packs
        # linear weights into kernel handles): the probe is then their only check, every push.
        self.probe_always = False
        self._warned_unverified = False

    def take_probe(
        self,
        check: PushCheck,
        model: torch.nn.Module | None,
        state: Mapping[str, torch.Tensor],
    ) -> None:
        """Fill `check` with the probe tokens and, given the trainer's `model` (whose weights are
        `state`), its logprobs on them; without a model the server's are only checked finite."""
        if model is None:
            check.probe_ids = self._probe_ids_from_state(state)
            return
        if self.probe_token_ids is None:
            self.probe_token_ids = default_probe_tokens(vocab_size_of(model))
        check.probe_ids = self.probe_token_ids
        check.expected = trainer_logprobs(model, state, check.probe_ids)

    def _probe_ids_from_state(self, state: Mapping[str, torch.Tensor]) -> list[int]:
        """Probe tokens without a model: in the vocabulary of the embedding (a finite check)."""
        if self.probe_token_ids is None:
            rows = [t.shape[0] for n, t in state.items() if n.endswith("embed_tokens.weight")]
            self.probe_token_ids = default_probe_tokens(rows[0] if rows else 2)
        return self.probe_token_ids

    def verify_all(
        self,
        fleet: ServerGroup,
        version: int,
        replies: dict[str, dict[str, Any]],
        tensors: dict[str, torch.Tensor],
        check: PushCheck,
        *,
        atol: float,
    ) -> None:
        """Verify every member of `fleet` on its reply; raises PublishVerificationError naming
        the first that fails. One that cannot be reached any more is moved from `replies` to
        `fleet.missed` (it rejoins when back) and the group is dropped."""
        for server in list(fleet.members):
            try:
                self._verify(server, version, replies[server.url], tensors, check, atol)
            except PublishVerificationError as e:
                raise PublishVerificationError(f"server {server.url}: {e}") from e
            except httpx.TransportError as e:  # it died since its reply: rejoin when back
                fleet.missed[server.url] = f"server {server.url}: unreachable after loading: {e}"
                del replies[server.url]
                fleet.drop()

    def _verify(
        self,
        server: ServerLink,
        version: int,
        reply: Mapping[str, Any],
        tensors: dict[str, torch.Tensor],
        check: PushCheck,
        atol: float,
    ) -> None:
        held = compare_held(reply, tensors, check.sent, check.sent_cast)
        if held.packed_away:
            self.probe_always = True  # the probe is their only check: run it on every push
        if held.unchecked and not self._warned_unverified:
            logger.warning(
                "%d sent tensors cannot be verified by checksum (%d held only inside the "
                "server's kernels, e.g. vLLM's CPU backend packs linear weights; the rest have "
                "no counterpart on the server), e.g. %s: the logprob probe checks them, on "
                "every push",
                len(held.unchecked),
                len(held.packed_away),
                list(held.unchecked[:3]),
            )
            self._warned_unverified = True
        check_pushed_server(
            server.http,
            version=version,
            reply=reply,
            held=held,
            probe_ids=check.probe_ids,
            expected_logprobs=check.expected,
            atol=probe_atol(server.served_dtype, default=atol),
        )
