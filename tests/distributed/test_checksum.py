"""Exact weight checksums: any bit change shows, order and layout of the work do not, and a
receiver that fuses, shards and pads tensors (vLLM) is compared through additive totals."""

from __future__ import annotations

import math

import torch

from ludic.distributed.checksum import (
    CHUNK_ROWS,
    ROW,
    LandedChecksums,
    RunningChecksums,
    cast_for,
    checksums,
    element_totals,
    fold_totals,
    held_name,
    mismatched,
    nonfinite,
    tensor_checksum,
)

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}


def test_one_ulp_in_one_element_changes_the_checksum() -> None:
    t = torch.randn(3 * ROW + 7) * 0.02
    u = t.clone()
    u[ROW + 3] = torch.nextafter(u[ROW + 3], torch.tensor(1.0))
    assert tensor_checksum(t) != tensor_checksum(u)
    assert tensor_checksum(t) == tensor_checksum(t.clone())


def test_values_moved_between_rows_change_the_weighted_part() -> None:
    t = torch.randn(4 * ROW)
    swapped = t.clone()
    swapped[0], swapped[ROW] = t[ROW].clone(), t[0].clone()  # same multiset of values
    assert tensor_checksum(t)[0] == tensor_checksum(swapped)[0]  # the total cannot tell
    assert tensor_checksum(t)[1] != tensor_checksum(swapped)[1]  # the weighted part does


def test_the_thread_count_does_not_change_the_result() -> None:
    t = torch.randn(1_000_003)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tensor_checksum(t)
        torch.set_num_threads(2)
        two = tensor_checksum(t)
    finally:
        torch.set_num_threads(before)
    assert one == two


def test_every_dtype_and_non_contiguous_tensors() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64):
        t = (torch.randn(37, 5) * 10).to(dtype)
        assert tensor_checksum(t) == tensor_checksum(t.clone())
        assert tensor_checksum(t.t()) == tensor_checksum(t.t().contiguous())
    assert tensor_checksum(torch.tensor([True, False])) != tensor_checksum(
        torch.tensor([True, True])
    )


def _wrap(value: int, bits: int) -> int:
    """`value` as a signed integer of `bits` bits (two's complement wrap)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _by_definition(t: torch.Tensor) -> tuple[int, int]:
    """The module docstring's checksum, in plain Python: element bits as signed integers;
    total mod 2^32 (2^64 for 8-byte dtypes); row sums of ROW elements in the accumulator
    (int32, int64 for 8-byte dtypes), each times the odd weight of its row index, mod 2^64."""
    width = t.element_size() * 8
    view = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    values = t.reshape(-1).view(view).tolist() if t.dtype != torch.bool else t.int().tolist()
    acc = 64 if width == 64 else 32
    rows = [values[i : i + ROW] for i in range(0, len(values), ROW)] or [[]]
    weighted = 0
    for index, row in enumerate(rows, start=1):
        w = _wrap(index * 0x9E3779B97F4A7C15, 64)
        w = _wrap((w ^ (w >> 29)) | 1, 64)
        weighted += _wrap(sum(row), acc) * w
    return sum(values) % (1 << acc), weighted % (1 << 64)


def test_checksums_of_many_tensors_at_once_follow_the_definition() -> None:
    # All tensors are combined in one pass at the end: each must get its own rows and weights.
    g = torch.Generator().manual_seed(7)
    tensors = {
        "three_rows": torch.randn(2 * ROW + 5, generator=g) * 1e6,
        "one_short_row": torch.randn(7, generator=g),
        "empty": torch.zeros(0),
        "exact_rows": torch.randint(
            -(2**31), 2**31 - 1, (3 * ROW,), dtype=torch.int32, generator=g
        ),
        "wide": torch.randint(-(2**62), 2**62, (ROW + 1,), dtype=torch.int64, generator=g),
        "half": torch.randn(ROW + 3, generator=g).to(torch.bfloat16),
        "flags": torch.tensor([True, False, True]),
    }
    expected = {name: _by_definition(t) for name, t in tensors.items()}
    assert checksums(tensors) == expected
    running = RunningChecksums(find_nonfinite=True)
    for name, t in reversed(tensors.items()):  # in pieces, another order
        for upto in (ROW + 1, t.numel()):
            running.advance(name, t, min(upto, t.numel()))
    assert running.finish() == (dict(reversed(expected.items())), [])


def test_a_cast_is_compared_in_the_receivers_dtype() -> None:
    sent = {"w": torch.randn(10, 10)}
    held = {"w": sent["w"].to(torch.bfloat16)}
    casts = cast_for(sent, {"w": "bfloat16"})
    assert casts == {"w": torch.bfloat16}
    assert mismatched(checksums(sent, cast_to=casts), checksums(held)) == []
    assert mismatched(checksums(sent), checksums(held)) == ["w"]
    assert mismatched(checksums(sent), {}) == ["w"]  # not reported: a mismatch


def _sent_totals(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    return {n: (e[0], e[1]) for n, e in element_totals(tensors.items()).items()}


def test_fused_sharded_and_padded_parameters_fold_exactly() -> None:
    q, k, v = torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 4)
    norm, embed = torch.randn(4), torch.randn(10, 4)
    sent = _sent_totals(
        {
            "l.q_proj.weight": q,
            "l.k_proj.weight": k,
            "l.v_proj.weight": v,
            "norm.weight": norm,
            "embed.weight": embed,
            "lm_head.weight": embed,  # tied: the receiver holds no separate lm_head
        }
    )
    qkv = torch.cat([q, k, v])
    padded = torch.cat([embed, torch.zeros(6, 4)])  # vocab padded to 16 rows with zeros
    ranks = [  # tensor parallel on 2 ranks: qkv and the embedding sharded, the norm replicated
        element_totals(
            [("l.qkv_proj.weight", qkv[:8]), ("norm.weight", norm), ("embed.weight", padded[:8])]
        ),
        element_totals(
            [("l.qkv_proj.weight", qkv[8:]), ("norm.weight", norm), ("embed.weight", padded[8:])]
        ),
    ]
    result = fold_totals(sent, ranks, PACKED)
    assert result.mismatched == () and result.num_checked == 3
    assert result.unverified == ("lm_head.weight",)
    stale = [dict(r) for r in ranks]
    stale[1]["norm.weight"] = element_totals([("norm.weight", norm + 1e-6)])["norm.weight"]
    stale[0]["l.qkv_proj.weight"] = element_totals([("x", qkv[:8] * 1.0001)])["x"]
    assert fold_totals(sent, stale, PACKED).mismatched == ("l.qkv_proj.weight",)  # rank 0's norm


def test_held_name_maps_packed_modules() -> None:
    assert held_name("m.layers.0.self_attn.k_proj.weight", PACKED) == (
        "m.layers.0.self_attn.qkv_proj.weight"
    )
    assert held_name("m.norm.weight", PACKED) == "m.norm.weight"


def test_landed_checksums_are_reused_only_while_untouched() -> None:
    base = torch.randn(4 * ROW)
    tensors = {"a": base[:ROW].view(32, 32), "b": base[ROW : 3 * ROW], "c": torch.randn(5)}
    landed = LandedChecksums()
    for name in ("a", "b"):
        landed.advance(name, tensors[name], tensors[name].numel())
    assert landed.held(tensors) == checksums(tensors)  # "c" was never taken
    with torch.no_grad():
        base.detach()[ROW + 7] += 1.0  # a write through another view of the same memory
    assert landed.held(tensors) == checksums(tensors)
    replaced = {**tensors, "a": tensors["a"].clone()}
    replaced["a"][0, 0] = 5.0  # new memory: not the tensor that was taken
    assert landed.held(replaced) == checksums(replaced)


def test_landed_checksums_of_tensors_sharing_memory_are_taken_again() -> None:
    # A tied weight received twice: the second write (a broadcast) bumps no version counter.
    shared = torch.zeros(ROW)
    landed = LandedChecksums()
    landed.advance("embed", shared, shared.numel())
    shared.view(torch.int32).numpy()[3] = 12345  # a write torch does not see
    tied = {"embed": shared, "lm_head": shared}
    assert landed.held(tied) == checksums(tied)
    overlapping = {"embed": shared[: ROW // 2], "head": shared[ROW // 4 :]}
    for name, t in overlapping.items():
        landed.advance(name, t, t.numel())
    shared.view(torch.int32).numpy()[ROW // 3] = 7
    assert landed.held(overlapping) == checksums(overlapping)


def _sent(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """What a sender takes of every tensor it sends: checksums and non-finite names, one pass."""
    running = RunningChecksums(find_nonfinite=True)
    for name, t in tensors.items():
        running.advance(name, t, t.numel())
    return running.finish()


def test_sender_checksums_and_nonfinite_in_one_pass_agree_with_each_alone() -> None:
    big = torch.randn(3 * CHUNK_ROWS * ROW + 5)  # several steps of the fused pass
    tensors = {
        "big": big,
        "half": torch.randn(2 * ROW + 1).to(torch.bfloat16),
        "huge": torch.full((4,), 3e38),  # its float32 sum overflows; every value is finite
        "ints": torch.arange(7),
        "empty": torch.zeros(0),
    }
    assert _sent(tensors) == (checksums(tensors), [])
    big[2 * CHUNK_ROWS * ROW + 3] = math.nan  # in a later step
    tensors["half"][-1] = -math.inf  # in the short last row
    sums, bad = _sent(tensors)
    assert sums == checksums(tensors)
    assert bad == nonfinite(tensors) == ["big", "half"]


def test_running_checksums_over_uneven_ranges_equal_the_whole_ones() -> None:
    g = torch.Generator().manual_seed(4)
    tensors = {
        "big": torch.randn(2 * CHUNK_ROWS * ROW + 3 * ROW + 7, generator=g),
        "half": torch.randn(5 * ROW + 1, generator=g).to(torch.bfloat16),
        "ints": torch.arange(3 * ROW, dtype=torch.int64),
        "empty": torch.zeros(0),
    }
    running = RunningChecksums(find_nonfinite=True)
    cast = RunningChecksums()
    for name, t in tensors.items():  # ends mid-row, repeats, goes back: all as the whole
        for upto in (0, ROW + 5, ROW + 5, 3, CHUNK_ROWS * ROW + 1, t.numel()):
            running.advance(name, t, min(upto, t.numel()))
            if t.is_floating_point():
                cast.advance(name, t, min(upto, t.numel()), dtype=torch.float16)
    assert running.finish() == (checksums(tensors), [])
    floats = {n: t for n, t in tensors.items() if t.is_floating_point()}
    cast_to = dict.fromkeys(floats, torch.float16)
    assert cast.finish()[0] == checksums(floats, cast_to=cast_to)


def test_running_checksums_find_a_nan_in_a_middle_range_and_leave_out_the_unfinished() -> None:
    t = torch.randn(4 * ROW)
    t[2 * ROW + 1] = math.nan
    running = RunningChecksums(find_nonfinite=True)
    for upto in (ROW, 2 * ROW, 3 * ROW, 4 * ROW):
        running.advance("t", t, upto)
    running.advance("unfinished", torch.randn(3 * ROW), 2 * ROW)
    sums, bad = running.finish()
    assert bad == ["t"] and list(sums) == ["t"] and sums["t"] == checksums({"t": t})["t"]
