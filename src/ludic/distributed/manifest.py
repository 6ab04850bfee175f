"""The tensor manifest of one weight push: names, shapes, dtypes, the chunking plan, the version.

Tensors smaller than `alone_bytes` are packed, in state-dict order, into buckets of one dtype of
at most `bucket_bytes` each; larger ones travel alone, so they are broadcast straight from (and,
on a server that supports it, into) the parameters' own memory, with no copy. Tensors that
already lie back to back in one storage (`follows`: a trainer whose parameters are views of one
flat buffer) share a bucket whatever their size, sent in place as one span (fewer, larger
broadcasts: each costs the transport a fixed share of CPU); a server that receives in place
lays such a bucket's parameters out back to back on the first push. The groups of tensors a
Llama-family server runs as one GEMM (`fused_groups`: each layer's q/k/v and gate/up weights,
and their biases) travel consecutively in one bucket, never split by a bucket boundary, so that
layout keeps them fusable (only their names are known here); large members that do not lie back
to back travel each alone instead, which a server leaves where they are. The manifest goes over the control
plane as JSON and is validated on arrival; the bytes go over the data plane. This module does
no I/O and knows nothing else about models or servers.

Shape legend: N = elements of a flat bucket.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ludic.types import JSON

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class ManifestError(ValueError):
    """A manifest is malformed or does not describe the tensors it travels with."""


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _NAMES:
        raise ManifestError(f"dtype {dtype} cannot be published; supported: {sorted(DTYPES)}")
    return _NAMES[dtype]


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorEntry:
    """One tensor: where its elements sit in which bucket."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    """Element offset of the tensor inside its bucket."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bucket:
    """One broadcast: a flat tensor of `numel` elements of `dtype`."""

    index: int
    dtype: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightManifest:
    """Everything the receiver needs before the bytes arrive. `full`: the push holds the whole
    state dict (the receiver loads it strictly); False allows a partial update. `checksums`:
    the sender verifies the push, so the receiver reports checksums of what it holds after
    loading; False (an unverified push) spares the receiver that pass over the weights.
    `piece_bytes`: a bucket larger than this travels as several broadcasts of this many bytes
    (the last one shorter; `pieces`), so that each side can read a piece while the next is on
    the wire (a receiver checksums what has landed); 0: one broadcast per bucket."""

    version: int
    tensors: tuple[TensorEntry, ...]
    buckets: tuple[Bucket, ...]
    full: bool = True
    checksums: bool = True
    piece_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def bucket_entries(self) -> list[list[TensorEntry]]:
        """The entries of each bucket, by bucket index, in offset order."""
        grouped: list[list[TensorEntry]] = [[] for _ in self.buckets]
        for e in self.tensors:
            grouped[e.bucket].append(e)
        return grouped

    def pieces(self, bucket: Bucket) -> list[tuple[int, int]]:
        """The element ranges [start, end) of `bucket` broadcast one after another."""
        step = self.piece_bytes // DTYPES[bucket.dtype].itemsize
        if step < 1 or bucket.numel <= step:
            return [(0, bucket.numel)]
        return [(a, min(a + step, bucket.numel)) for a in range(0, bucket.numel, step)]

    def to_json(self) -> JSON:
        body: dict[str, Any] = {
            "version": self.version,
            "full": self.full,
            "checksums": self.checksums,
            "buckets": [[b.dtype, b.numel] for b in self.buckets],
            "tensors": [[e.name, e.dtype, list(e.shape), e.bucket, e.offset] for e in self.tensors],
        }
        if self.piece_bytes:  # absent: whole buckets (what a receiver without pieces expects)
            body["piece_bytes"] = self.piece_bytes
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WeightManifest:
        """Parse and validate (types, dtypes, bucket bounds, no overlaps); ManifestError if bad.
        A manifest without "checksums" (an older sender) asks for them."""
        try:
            version, full = data["version"], data["full"]
            wants_checksums = data.get("checksums", True)
            piece_bytes = _count(data.get("piece_bytes", 0), "piece_bytes")
            buckets = tuple(
                Bucket(index=i, dtype=str(d), numel=_count(n, "bucket size"))
                for i, (d, n) in enumerate(data["buckets"])
            )
            tensors = tuple(
                TensorEntry(
                    name=str(name),
                    dtype=str(dtype),
                    shape=tuple(_count(s, f"dimension of {name}") for s in shape),
                    bucket=_count(bucket, f"bucket of {name}"),
                    offset=_count(offset, f"offset of {name}"),
                )
                for name, dtype, shape, bucket, offset in data["tensors"]
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ManifestError):
                raise
            raise ManifestError(f"malformed weight manifest ({type(e).__name__}: {e})") from e
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ManifestError(f"manifest version must be an int >= 0, got {version!r}")
        if version >= 2**63:
            raise ManifestError(f"manifest version must be below 2**63, got {version!r}")
        for key, flag in (("full", full), ("checksums", wants_checksums)):
            if not isinstance(flag, bool):
                raise ManifestError(f"manifest {key!r} must be a bool, got {flag!r}")
        manifest = cls(
            version=version,
            tensors=tensors,
            buckets=buckets,
            full=full,
            checksums=wants_checksums,
            piece_bytes=piece_bytes,
        )
        _validate_layout(manifest)
        return manifest


def plan_manifest(
    tensors: Mapping[str, torch.Tensor],
    *,
    version: int,
    bucket_bytes: int,
    alone_bytes: int | None = None,
    full: bool = True,
    checksums: bool = True,
    piece_bytes: int = 0,
    together: Sequence[Sequence[str]] | None = None,
) -> WeightManifest:
    """Pack `tensors` (in order) into per-dtype buckets of at most `bucket_bytes`; a tensor of
    at least `alone_bytes` (default: `bucket_bytes`) gets a bucket of its own. `checksums`:
    ask the receiver to report checksums of what it holds (the sender verifies).
    `piece_bytes`: broadcast larger buckets in pieces of this size (0: whole).

    `together`: groups of names (default: `fused_groups`) that are never split across buckets
    or interleaved with other tensors: each group travels consecutively in one bucket (so a
    server laying a bucket out back to back keeps it fusable), unless every member is large
    and they do not lie back to back, when each travels alone (untouched by the server)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    if piece_bytes < 0:
        raise ValueError(f"piece_bytes must be >= 0, got {piece_bytes}")
    alone = bucket_bytes if alone_bytes is None else min(alone_bytes, bucket_bytes)
    plan = _Planner(tensors, bucket_bytes=bucket_bytes, alone=alone)
    groups = fused_groups(list(tensors)) if together is None else together
    for unit in _units(tensors, groups):
        plan.place(unit)
    return WeightManifest(
        version=version,
        tensors=tuple(plan.entries),
        buckets=tuple(plan.buckets),
        full=full,
        checksums=checksums,
        piece_bytes=piece_bytes,
    )


# Projections reading one input that inference engines run as one GEMM (the embedded engine's
# lean forward, vLLM's merged q/k/v and gate/up layers), by module scope and names.
_FUSED = (("self_attn.", ("q_proj", "k_proj", "v_proj")), ("mlp.", ("gate_proj", "up_proj")))


def fused_groups(names: Sequence[str]) -> list[list[str]]:
    """The groups of `names` a Llama-family server fuses: each layer's q/k/v weights, their
    biases, its gate/up weights and biases (any name prefix), where all members are present."""
    present = set(names)
    groups: list[list[str]] = []
    for name in names:
        for scope, projections in _FUSED:
            for kind in ("weight", "bias"):
                suffix = f"{scope}{projections[0]}.{kind}"
                if name.endswith(suffix):
                    prefix = name[: -len(suffix)]
                    group = [f"{prefix}{scope}{p}.{kind}" for p in projections]
                    if all(g in present for g in group):
                        groups.append(group)
    return groups


def _units(tensors: Mapping[str, torch.Tensor], groups: Sequence[Sequence[str]]) -> list[list[str]]:
    """`tensors`' names in order, each group (of one dtype, all present, no name twice) pulled
    together at its first member's place: the units the planner places whole."""
    owner: dict[str, list[str]] = {}
    for group in groups:
        members = list(group)
        if (
            len(members) > 1
            and len(set(members)) == len(members)
            and all(n in tensors and n not in owner for n in members)
            and len({tensors[n].dtype for n in members}) == 1
        ):
            owner.update({n: members for n in members})
    units: list[list[str]] = []
    placed: set[str] = set()
    for name in tensors:
        if name not in placed:
            unit = owner.get(name, [name])
            units.append(unit)
            placed.update(unit)
    return units


class _Planner:
    """Places units (`_units`) into buckets, keeping runs of tensors that lie back to back in
    one storage together as one span."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], *, bucket_bytes: int, alone: int):
        self.tensors = tensors
        self.bucket_bytes = bucket_bytes
        self.alone = alone
        self.buckets: list[Bucket] = []
        self.entries: list[TensorEntry] = []
        self.open_bucket: dict[str, int] = {}  # dtype -> the bucket of small tensors being filled
        # The bucket of the last lone tensor (or its run) and its last tensor: a tensor lying
        # right after that one in memory joins it, so the bucket stays one span (no copy).
        self.run: int | None = None
        self.run_last: str | None = None
        names = list(tensors)
        after = follows(list(tensors.values()))
        self.prev = {n: None if a is None else names[a] for n, a in zip(names, after, strict=True)}

    def _nbytes(self, name: str) -> int:
        t = self.tensors[name]
        return t.numel() * t.element_size()

    def place(self, unit: list[str]) -> None:
        dtype = dtype_name(self.tensors[unit[0]].dtype)
        nbytes = sum(self._nbytes(n) for n in unit)
        chained = all(self.prev[b] == a for a, b in itertools.pairwise(unit))
        if not chained and all(self._nbytes(n) >= self.alone for n in unit):
            for name in unit:  # each alone: a server leaves single-tensor buckets where they are
                self._add([name], dtype, self._new_bucket(dtype))
            self.run = None  # nothing may join one of them (it would be laid out elsewhere)
            return
        run = self.run
        if (
            run is not None
            and chained
            and self.prev[unit[0]] == self.run_last
            and self.buckets[run].dtype == dtype
            and self.buckets[run].nbytes + nbytes <= self.bucket_bytes
        ):
            index: int | None = run
        else:
            index = None if nbytes >= self.alone else self.open_bucket.get(dtype)
        if index is None or (
            index != run and self.buckets[index].nbytes + nbytes > self.bucket_bytes
        ):
            index = self._new_bucket(dtype)
            if nbytes < self.alone:
                self.open_bucket[dtype] = index
        if chained and (nbytes >= self.alone or index == run):
            self.run, self.run_last = index, unit[-1]
        elif nbytes >= self.alone:
            self.run = None  # a large group that is packed (copied): nothing joins it
        self._add(unit, dtype, index)
        if nbytes < self.alone and self.buckets[index].nbytes >= self.bucket_bytes:
            self.open_bucket.pop(dtype, None)  # full: the next small tensor opens a new bucket

    def _new_bucket(self, dtype: str) -> int:
        self.buckets.append(Bucket(index=len(self.buckets), dtype=dtype, numel=0))
        return len(self.buckets) - 1

    def _add(self, unit: list[str], dtype: str, index: int) -> None:
        for name in unit:
            tensor, bucket = self.tensors[name], self.buckets[index]
            self.entries.append(
                TensorEntry(
                    name=name,
                    dtype=dtype,
                    shape=tuple(tensor.shape),
                    bucket=index,
                    offset=bucket.numel,
                )
            )
            self.buckets[index] = Bucket(
                index=index, dtype=dtype, numel=bucket.numel + tensor.numel()
            )


def follows(tensors: list[torch.Tensor]) -> list[int | None]:
    """For each tensor, the position of an earlier one that it starts right after, in the same
    storage (both contiguous, one dtype and device), else None: which tensors can travel as one
    span without a copy. Tied aliases (the same memory twice) follow nothing."""
    ends: dict[tuple[int, int, torch.dtype, torch.device], int] = {}
    out: list[int | None] = []
    for i, t in enumerate(tensors):
        if not t.is_contiguous() or t.numel() == 0:
            out.append(None)
            continue
        storage = t.untyped_storage().data_ptr()
        out.append(ends.get((storage, t.data_ptr(), t.dtype, t.device)))
        ends[(storage, t.data_ptr() + t.numel() * t.element_size(), t.dtype, t.device)] = i
    return out


def flatten_into(
    flat_N: torch.Tensor, entries: list[TensorEntry], tensors: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """Copy each entry's tensor into its slice of `flat_N` (the send side); returns `flat_N`."""
    for e in entries:
        flat_N[e.offset : e.offset + e.numel].copy_(tensors[e.name].reshape(-1))
    return flat_N


def unflatten(flat_N: torch.Tensor, entries: list[TensorEntry]) -> dict[str, torch.Tensor]:
    """Views of `flat_N` shaped as each entry (no copy)."""
    return {e.name: flat_N[e.offset : e.offset + e.numel].view(e.shape) for e in entries}


_SAME_MODEL = (
    "start the trainer from the model the server loaded: `ludic train --model DIR` or `ludic "
    "learner --model DIR` with the DIR given to `ludic serve --model DIR`"
)


def check_against(
    manifest: WeightManifest,
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, torch.dtype] | None = None,
) -> None:
    """ManifestError unless every tensor exists in `shapes` (the served model's state dict) with
    the same shape and, where `dtypes` (the served tensors' dtypes) names it, a dtype of the
    same kind (`check_dtype_kinds`), and, for a full push, every name of `shapes` is present."""
    unknown = [e.name for e in manifest.tensors if e.name not in shapes]
    if unknown:
        raise ManifestError(
            f"{len(unknown)} tensors the served model does not have, e.g. {unknown[:3]}: the "
            f"trainer and the server must run the same architecture ({_SAME_MODEL})"
        )
    wrong = [
        f"{e.name}: sent {e.shape}, served {tuple(shapes[e.name])}"
        for e in manifest.tensors
        if tuple(shapes[e.name]) != e.shape
    ]
    if wrong:
        raise ManifestError(f"{len(wrong)} shape mismatches, e.g. {wrong[:3]} ({_SAME_MODEL})")
    if dtypes is not None:
        check_dtype_kinds(manifest, dtypes)
    if manifest.full:
        missing = sorted(set(shapes) - {e.name for e in manifest.tensors})
        if missing:
            raise ManifestError(
                f"a full push misses {len(missing)} tensors of the served model, e.g. "
                f"{missing[:3]}; send the whole state dict or mark the push partial (full=False)"
            )


def check_dtype_kinds(manifest: WeightManifest, dtypes: Mapping[str, torch.dtype]) -> None:
    """ManifestError unless each tensor of `manifest` that `dtypes` names is sent in a dtype of
    the served tensor's kind: floating for floating (any width: a bf16 wire for fp32 weights, as
    `wire_dtype` sends, is cast on arrival), non-floating for non-floating. A float entry for an
    int buffer (or the reverse) would be cast into nonsense, so it is refused before any byte
    moves, naming each tensor with both dtypes."""
    wrong = [
        f"{e.name}: sent {e.dtype}, served {str(dtypes[e.name]).removeprefix('torch.')}"
        for e in manifest.tensors
        if e.name in dtypes
        and DTYPES[e.dtype].is_floating_point != dtypes[e.name].is_floating_point
    ]
    if wrong:
        raise ManifestError(
            f"{len(wrong)} tensors sent in another dtype kind than the served model holds them, "
            f"e.g. {wrong[:3]}: a weight is cast on arrival only within its kind (floating into "
            "floating of any width, integer or bool into integer or bool); the trainer sends "
            f"another model's state dict, or casts its buffers ({_SAME_MODEL}, and keep "
            "wire_dtype for floating tensors)"
        )


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{what} must be an int >= 0, got {value!r}")
    return value


def _validate_layout(manifest: WeightManifest) -> None:
    names = [e.name for e in manifest.tensors]
    if len(set(names)) != len(names):
        raise ManifestError("manifest names a tensor twice")
    for b in manifest.buckets:
        if b.dtype not in DTYPES:
            raise ManifestError(f"bucket {b.index} has unsupported dtype {b.dtype!r}")
    used = [0] * len(manifest.buckets)
    for e in manifest.tensors:
        if e.bucket >= len(manifest.buckets):
            raise ManifestError(f"{e.name} points at bucket {e.bucket}, which does not exist")
        bucket = manifest.buckets[e.bucket]
        if e.dtype != bucket.dtype:
            raise ManifestError(f"{e.name} is {e.dtype} but its bucket holds {bucket.dtype}")
        if e.offset != used[e.bucket]:
            raise ManifestError(f"{e.name} does not start where the previous tensor ended")
        used[e.bucket] += e.numel
    for b, n in zip(manifest.buckets, used, strict=True):
        if n != b.numel:
            raise ManifestError(f"bucket {b.index} holds {b.numel} elements, its tensors {n}")
