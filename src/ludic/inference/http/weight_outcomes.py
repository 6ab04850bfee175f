"""What a weight push ends in, on the serving side: `SyncResult` (a loaded push, as the
receiver reports it), `WeightSyncError` (a push refused or failed, with the HTTP status to
answer), `NonfiniteRefusal` (a push refused for nan or inf, 422) and `nonfinite_refusal`, the
words both the embedded server and the vLLM extension answer with. Split from
`weight_receiver.py`, which receives and loads pushes; nothing here does I/O. Also
`held_checksums`, what a verified push's reply says the served model holds.

A push holding a nan or an inf is refused (422, naming the tensors; `ludic.inference.weights.
check_finite`): received into buffers, before anything is loaded (the served model stays as it
was); received in place, once the buckets have landed, before the new version is served (the
served model then holds them: the reply and `last_error` say so, and the next finite push
repairs it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ludic.distributed.checksum import LandedChecksums
from ludic.distributed.manifest import WeightManifest, dtype_name
from ludic.inference.weights import NonFiniteWeightsError

__all__ = [
    "NonfiniteRefusal",
    "SyncResult",
    "WeightSyncError",
    "held_checksums",
    "nonfinite_refusal",
    "served_dtype",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncResult:
    """A loaded push. `checksums`: name -> (total, weighted) of each pushed tensor as the
    served model holds it after loading (`ludic.distributed.checksum`); `held_dtypes`: the
    served dtype of the tensors held in another dtype than they were sent in."""

    policy_version: int
    num_tensors: int
    num_bytes: int
    checksums: dict[str, tuple[int, int]] | None = None
    held_dtypes: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "policy_version": self.policy_version,
            "num_tensors": self.num_tensors,
            "num_bytes": self.num_bytes,
        }
        if self.checksums is not None:
            body["checksums"] = {name: list(c) for name, c in self.checksums.items()}
            body["held_dtypes"] = self.held_dtypes or {}
        return body


class WeightSyncError(RuntimeError):
    """A push could not be received or loaded (`status` is the HTTP status to answer with)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class NonfiniteRefusal(WeightSyncError):
    """A push received whole but refused for its values (nan or inf): 422."""

    def __init__(self, error: NonFiniteWeightsError, *, landed_in_place: bool) -> None:
        super().__init__(
            nonfinite_refusal(error.names, landed_in_place=landed_in_place), status=422
        )


def nonfinite_refusal(names: list[str], *, landed_in_place: bool) -> str:
    """What a server answers (with a 422) to a push whose tensors `names` hold nan or inf:
    the embedded server's receiver and the vLLM extension's routes say the same."""
    shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    where = (
        "they were received in place, so the served model holds them now (its policy "
        "version is unchanged) until a finite push replaces them"
        if landed_in_place
        else "nothing was loaded: the served model is as it was"
    )
    return (
        f"refused weight push: {len(names)} tensor(s) hold nan or inf ({shown}); "
        f"{where}. The trainer's weights diverged: fix the training step or push from a "
        "finite checkpoint"
    )


def receive_failed(e: Exception, *, in_place: bool) -> WeightSyncError:
    """A push whose receive failed (a failed collective leaves the group unusable): a 500 that
    says to `/init` again, and that the served model may be partly updated when the bytes
    landed in place."""
    partly = " (the served model may be partly updated: push again)" if in_place else ""
    return WeightSyncError(
        f"receiving weights failed ({type(e).__name__}: {e}); POST /init again{partly}",
        status=500,
    )


def held_checksums(
    manifest: WeightManifest,
    landed: LandedChecksums | None,
    live: Mapping[str, torch.Tensor] | None,
) -> tuple[dict[str, tuple[int, int]] | None, dict[str, str] | None]:
    """Checksums of what the served model (`live`) holds now under the pushed names, and the
    served dtype of those held in another dtype than sent: checksums taken as the buckets
    landed where nothing touched the tensor since, the rest computed now (`LandedChecksums`).
    None when the push did not ask for them (unverified), or without `live` (the publisher
    then cannot verify the load and says so)."""
    if live is None or landed is None:
        return None, None
    held = {e.name: live[e.name] for e in manifest.tensors if e.name in live}
    dtypes = {
        e.name: dtype_name(held[e.name].dtype)
        for e in manifest.tensors
        if e.name in held and dtype_name(held[e.name].dtype) != e.dtype
    }
    return landed.held(held), dtypes


def served_dtype(targets: Mapping[str, torch.Tensor]) -> str | None:
    """The dtype of the served model's floating weights (the probe's tolerance follows it)."""
    floating = [t.dtype for t in targets.values() if t.is_floating_point()]
    return None if not floating else dtype_name(max(set(floating), key=floating.count))
