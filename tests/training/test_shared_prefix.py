"""A group's shared prompt computed once in the training forward (`ludic.training.shared_prefix`):
which rows share what (`shared_prefix_groups`), the same logprobs, entropies and gradients as
the per-row path (padded and packed, mixed prompt lengths, rows sharing nothing, one-row
groups, sampling transforms, micro-batch splits, LoRA, a reference model), the planner keeping
groups together, and a Trainer step giving the same weights with the switch on or off.

The float64 checks patch HF's RMSNorm to stay in float64 (it computes in float32 whatever the
model's dtype, and the shared path sums a prefix token's gradient over rows before that norm's
backward, the per-row path after: a float32 rounding difference, not a bug).
"""

from __future__ import annotations

import copy
import random
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from training_fakes import VOCAB, ListSource, tiny_llama

from ludic.rollouts.samples import SAWItem
from ludic.training import (
    ConstantCredit,
    RLAlgorithm,
    Trainer,
    TrainerConfig,
    accumulate_gradients,
    add_lora,
    collate,
    make_grpo,
    plan_micro_batches,
)
from ludic.training import shared_prefix as shared_prefix_module
from ludic.training.collate import (
    CollatedBatch,
    RowGroup,
    shared_prefix_groups,
    shared_prefix_pays,
)
from ludic.training.logprobs import sequence_logprobs
from ludic.training.shared_prefix import (
    shared_prefix_logprobs,
    shared_prefix_min_tokens,
    supports_shared_prefix,
)

MIN = 4  # shortest prefix run once in these tests


def _exact_norms(model: torch.nn.Module) -> torch.nn.Module:
    """RMSNorm in the model's own dtype (HF's casts to float32)."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
    return model


def _model64(seed: int = 0) -> torch.nn.Module:
    return _exact_norms(tiny_llama(seed=seed).double().train())


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def _row(
    prompt: Sequence[int], completion: Sequence[int], *, weight: float = 1.0, **meta: Any
) -> SAWItem:
    ids = tuple(prompt) + tuple(completion)
    mask = (0,) * len(prompt) + (1,) * len(completion)
    lp = tuple(-0.5 - 0.01 * i if m else 0.0 for i, m in enumerate(mask))
    return SAWItem(input_ids=ids, action_mask=mask, weight=weight, behavior_logprobs=lp, meta=meta)


def _grpo_items(seed: int = 0) -> list[SAWItem]:
    """Two groups of different prompt lengths, interleaved; a multi-turn row sharing only the
    first prompt; a row sharing nothing; a prompt with one row; a completion of one token."""
    rng = random.Random(seed)
    a, b, lone = _tokens(rng, 9), _tokens(rng, 14), _tokens(rng, 7)
    obs = _tokens(rng, 3)
    multi_ids = tuple(a) + tuple(_tokens(rng, 4)) + tuple(obs) + tuple(_tokens(rng, 5))
    multi_mask = (0,) * 9 + (1,) * 4 + (0,) * 3 + (1,) * 5
    multi = SAWItem(
        input_ids=multi_ids,
        action_mask=multi_mask,
        weight=0.3,
        behavior_logprobs=tuple(-0.4 if m else 0.0 for m in multi_mask),
    )
    return [
        _row(a, _tokens(rng, 6), weight=1.0),
        _row(b, _tokens(rng, 11), weight=-0.5),
        _row(a, _tokens(rng, 12), weight=0.7),
        _row(_tokens(rng, 5), _tokens(rng, 8), weight=0.2),  # shares nothing
        _row(b, _tokens(rng, 3), weight=1.5),
        multi,
        _row(lone, _tokens(rng, 6), weight=-1.0),  # a prompt with one row
        _row(a, _tokens(rng, 1), weight=-0.8),
    ]


def _grads(
    model: torch.nn.Module, batch: CollatedBatch, weights_BT: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logprobs_BT, entropy_BT = sequence_logprobs(model, batch, **kwargs)
    objective = (logprobs_BT * weights_BT).sum()
    if entropy_BT is not None:
        objective = objective + (entropy_BT * weights_BT.flip(0)).sum()
    objective.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return logprobs_BT.detach(), None if entropy_BT is None else entropy_BT.detach(), grads


def _close(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], rtol: float) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        scale = max(float(x.abs().max()), 1e-30)
        assert float((x - y).abs().max()) <= rtol * scale


# -- which rows share what -----------------------------------------------------------------


def test_groups_are_the_rows_with_the_same_prompt() -> None:
    batch = collate(_grpo_items())
    groups = shared_prefix_groups(batch, min_tokens=MIN)
    assert [g.rows for g in groups] == [(0, 2, 5, 7), (1, 4), (3,), (6,)]
    # the groups share their prompt (9 and 14 tokens); no completion token by chance
    assert [g.shared_tokens for g in groups] == [9, 14, 0, 0]
    # a longer threshold leaves a prompt of 9 tokens to the per-row path
    longer = shared_prefix_groups(batch, min_tokens=10)
    assert [(g.rows, g.shared_tokens) for g in longer if g.shared_tokens] == [((1, 4), 14)]
    assert len(longer) == 7


def test_shared_prefix_runs_into_identical_completion_tokens_up_to_the_shortest_row() -> None:
    prompt, rng = list(range(1, 8)), random.Random(3)
    same = [50, 51, 52]
    items = [_row(prompt, same + _tokens(rng, 4)), _row(prompt, same), _row(prompt, [*same, 9])]
    groups = shared_prefix_groups(collate(items), min_tokens=MIN)
    assert groups == [RowGroup(rows=(0, 1, 2), shared_tokens=10)]  # row 1 is all shared


def test_shared_prefix_stops_where_the_sampling_transform_differs() -> None:
    prompt, same = list(range(1, 8)), [50, 51, 52, 53]
    hot = {"behavior_sampling": {"temperature": 0.7, "top_k": 20, "top_p": 1.0}}
    items = [_row(prompt, same, **hot), _row(prompt, same)]
    groups = shared_prefix_groups(collate(items), min_tokens=MIN)
    assert groups == [RowGroup(rows=(0, 1), shared_tokens=7)]


def test_min_tokens_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="min_tokens must be >= 2"):
        shared_prefix_groups(collate(_grpo_items()), min_tokens=1)


# -- same numbers as the per-row path ------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("with_entropy", [False, True], ids=["logprobs", "entropy"])
def test_logprobs_and_gradients_equal_the_per_row_path(packed: bool, with_entropy: bool) -> None:
    model = _model64()
    batch = collate(_grpo_items())
    weights_BT = torch.randn(batch.input_ids_BT.shape, dtype=torch.float64)
    calls: list[int] = []
    real = shared_prefix_module.shared_prefix_logprobs

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    lp, h, grads = _grads(model, batch, weights_BT, packed=packed, with_entropy=with_entropy)
    shared_prefix_module.shared_prefix_logprobs = counted  # type: ignore[assignment]
    try:
        lp2, h2, grads2 = _grads(
            model,
            batch,
            weights_BT,
            packed=packed,
            with_entropy=with_entropy,
            shared_prefix_min_tokens=MIN,
        )
    finally:
        shared_prefix_module.shared_prefix_logprobs = real  # type: ignore[assignment]
    assert calls == [1]  # the shared path ran
    assert lp2.shape == lp.shape and lp2.dtype == lp.dtype
    assert torch.equal(lp2 == 0, lp == 0)  # same layout: 0 at position 0 and on padding
    assert torch.allclose(lp2, lp, rtol=0, atol=1e-12)
    if with_entropy:
        assert h is not None and h2 is not None and torch.allclose(h2, h, rtol=0, atol=1e-12)
    else:
        assert h2 is None
    _close(grads, grads2, rtol=1e-11)


def _sampled_items() -> list[SAWItem]:
    hot = {"behavior_sampling": {"temperature": 0.7, "top_k": 30, "top_p": 0.9}}
    rng = random.Random(5)
    prompt = _tokens(rng, 10)
    return [_row(prompt, _tokens(rng, 6), **hot), _row(prompt, _tokens(rng, 9)), _row(prompt, [7])]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_sampling_transforms_match(packed: bool) -> None:
    model = _model64()
    batch = collate(_sampled_items())
    assert batch.sampling is not None
    weights_BT = torch.randn(batch.input_ids_BT.shape, dtype=torch.float64)
    lp, _, grads = _grads(model, batch, weights_BT, packed=packed)
    lp2, _, grads2 = _grads(model, batch, weights_BT, packed=packed, shared_prefix_min_tokens=MIN)
    assert torch.allclose(lp2, lp, rtol=0, atol=1e-12)
    _close(grads, grads2, rtol=1e-11)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_eager_attention_matches_within_its_float32_softmax(packed: bool) -> None:
    """Eager attention takes the packed path's 4D mask as scores to add; it runs its softmax
    in float32 (HF), so rows of other widths round differently at that precision."""
    model = _model64()
    model.config._attn_implementation = "eager"
    batch = collate(_grpo_items())
    weights_BT = torch.randn(batch.input_ids_BT.shape, dtype=torch.float64)
    lp, _, grads = _grads(model, batch, weights_BT, packed=packed)
    lp2, _, grads2 = _grads(model, batch, weights_BT, packed=packed, shared_prefix_min_tokens=MIN)
    assert torch.allclose(lp2, lp, rtol=0, atol=1e-6)
    _close(grads, grads2, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_duplicate_rows_and_a_row_that_is_all_prefix(packed: bool) -> None:
    """Identical completions (common at low temperature) share everything but their last
    token; a row equal to the common prefix runs one token after it."""
    rng = random.Random(8)
    prompt, completion = _tokens(rng, 9), _tokens(rng, 5)
    items = [_row(prompt, completion), _row(prompt, completion), _row(prompt, completion[:2])]
    batch = collate(items)
    assert shared_prefix_groups(batch, min_tokens=MIN) == [
        RowGroup(rows=(0, 1, 2), shared_tokens=11)
    ]
    model = _model64()
    weights_BT = torch.randn(batch.input_ids_BT.shape, dtype=torch.float64)
    lp, _, grads = _grads(model, batch, weights_BT, packed=packed)
    lp2, _, grads2 = _grads(model, batch, weights_BT, packed=packed, shared_prefix_min_tokens=MIN)
    assert torch.allclose(lp2, lp, rtol=0, atol=1e-12)
    _close(grads, grads2, rtol=1e-11)


def test_float32_logprobs_match_within_rounding() -> None:
    """What the importance ratio sees: the per-row and shared logprobs of a float32 model."""
    model = tiny_llama(seed=1)
    batch = collate(_grpo_items(seed=2))
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, batch)
        lp2, _ = sequence_logprobs(model, batch, shared_prefix_min_tokens=MIN)
    assert float((lp2 - lp).abs().max()) < 1e-5


def test_direct_call_checks_the_groups() -> None:
    model, batch = _model64(), collate(_grpo_items())
    with pytest.raises(ValueError, match="every row exactly once"):
        shared_prefix_logprobs(model, batch, [RowGroup(rows=(0, 2), shared_tokens=9)])
    singles = [RowGroup(rows=(row,)) for row in range(batch.num_sequences)]
    with pytest.raises(ValueError, match="no group shares a prefix"):
        shared_prefix_logprobs(model, batch, singles)


def _dynamic_rope_llama() -> torch.nn.Module:
    """tiny_llama with dynamic-NTK rope (its rotary rescales past max_position_embeddings)."""
    model = tiny_llama()
    config = copy.deepcopy(model.config)
    config.max_position_embeddings = 16
    params = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    for name in ("rope_scaling", "rope_parameters"):
        if hasattr(config, name):
            setattr(config, name, params)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return type(model)(config)


def _checkpointed(model: torch.nn.Module) -> torch.nn.Module:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _shared_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = shared_prefix_module.shared_prefix_logprobs

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(shared_prefix_module, "shared_prefix_logprobs", counted)
    return calls


def test_unsupported_setups_fall_back_to_the_per_row_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_llama()
    assert supports_shared_prefix(model, packed=True) is None
    assert shared_prefix_min_tokens(model, enabled=True) == shared_prefix_module.MIN_SHARED_TOKENS
    assert shared_prefix_min_tokens(model, enabled=False) is None
    assert shared_prefix_min_tokens(model, enabled=True, batch_invariant=True) is None
    flash = copy.deepcopy(model)
    flash.config._attn_implementation = "flash_attention_2"
    assert "4D mask" in (supports_shared_prefix(flash, packed=True) or "")
    assert supports_shared_prefix(flash, packed=False) is None
    assert shared_prefix_min_tokens(flash, enabled=True, packed=True) is None
    windowed = copy.deepcopy(model)
    windowed.config.sliding_window = 16
    dynamic = _dynamic_rope_llama()
    checkpointed = _checkpointed(tiny_llama())
    lora = add_lora(tiny_llama(), rank=4, alpha=8, target_modules=("q_proj",))
    lora_checkpointed = _checkpointed(lora)  # PEFT: checkpointing on the base model
    unsupported = {
        "sliding-window": windowed,
        "dynamic-NTK": dynamic,
        "gradient checkpointing": checkpointed,
    }
    assert "gradient checkpointing" in (
        supports_shared_prefix(lora_checkpointed, packed=False) or ""
    )
    calls = _shared_calls(monkeypatch)
    batch = collate(_grpo_items())
    for reason, unsupported_model in unsupported.items():
        for packed in (False, True):
            assert reason in (supports_shared_prefix(unsupported_model, packed=packed) or "")
            per_row = sequence_logprobs(unsupported_model, batch, packed=packed)[0]
            got = sequence_logprobs(
                unsupported_model, batch, packed=packed, shared_prefix_min_tokens=MIN
            )[0]
            assert torch.equal(got, per_row), reason  # the same path, so the same bits
            assert got.abs().sum() > 0
    assert calls == []
    # the numbers differ from what the shared path would give a dynamic-rope model: its rotary
    # depends on each call's length (the prefix call is shorter than the row)
    # (float64, where the shared path matches the per-row one to ~1e-12 otherwise)
    sharing = shared_prefix_groups(batch, min_tokens=MIN)
    dynamic64 = _exact_norms(dynamic.double())
    wrong = shared_prefix_logprobs(dynamic64, batch, sharing)[0]
    assert float((wrong - sequence_logprobs(dynamic64, batch)[0]).detach().abs().max()) > 1e-6


def test_gradient_checkpointing_runs_per_row_with_the_per_row_gradients() -> None:
    """HF checkpointed layers force use_cache=False (the shared path crashed on the missing
    cache): the per-row path runs, with the gradients of the model without checkpointing."""
    batch = collate(_grpo_items())
    weights_BT = torch.linspace(-1, 1, batch.input_ids_BT.numel()).view_as(batch.input_ids_BT)
    plain = _model64()
    lp, _, grads = _grads(plain, batch, weights_BT.double())
    checkpointed = _checkpointed(_model64())
    lp_ckpt, _, grads_ckpt = _grads(
        checkpointed, batch, weights_BT.double(), shared_prefix_min_tokens=MIN
    )
    torch.testing.assert_close(lp_ckpt, lp, rtol=0, atol=1e-12)
    _close(grads, grads_ckpt, rtol=1e-11)


# -- micro-batches -------------------------------------------------------------------------


def test_planner_keeps_groups_together() -> None:
    batch = collate(_grpo_items())
    lengths = batch.lengths_B.tolist()
    groups = shared_prefix_groups(batch, min_tokens=MIN)
    for packed in (False, True):
        for budget in (60, 90, 150, None):
            plan = plan_micro_batches(lengths, budget, packed=packed, groups=groups)
            assert sorted(row for micro in plan for row in micro) == list(range(len(lengths)))
            for group in groups:  # every group fits these budgets on its own
                assert sum(set(group.rows) <= set(micro) for micro in plan) == 1
    # group a (4 rows, 8 + 4 x 13 padded tokens) exceeds 40: runs of its rows that fit
    assert plan_micro_batches(lengths, 40, groups=groups) == [[0, 2], [5, 7], [1, 4], [3, 6]]
    # without groups: the rows in order, as before
    assert plan_micro_batches(lengths, 60) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_planner_counts_a_shared_prefix_once_and_splits_an_oversized_group() -> None:
    lengths = [20, 20, 20, 20]
    group = [RowGroup(rows=(0, 1, 2, 3), shared_tokens=16)]
    # padded: 1 prefix row of 15 + 4 rows of 5 = 35 tokens (80 per row)
    assert plan_micro_batches(lengths, 35, groups=group) == [[0, 1, 2, 3]]
    assert plan_micro_batches(lengths, 35, packed=True, groups=group) == [[0, 1, 2, 3]]
    assert plan_micro_batches(lengths, 35) == [[0], [1], [2], [3]]
    # over budget: consecutive runs that fit, each running the prefix again
    assert plan_micro_batches(lengths, 25, groups=group) == [[0, 1], [2, 3]]
    assert plan_micro_batches(lengths, 10, groups=group) == [[0], [1], [2], [3]]


def test_the_shared_path_runs_only_when_it_computes_fewer_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the review's slow case: 2 groups of 8 (prompt 64, completion 64) and a 32 + 256 row
    # sharing nothing, which widens every padded rest row to 288 tokens
    lengths = [128] * 16 + [288]
    groups = [
        RowGroup(rows=tuple(range(8)), shared_tokens=64),
        RowGroup(rows=tuple(range(8, 16)), shared_tokens=64),
        RowGroup(rows=(16,)),
    ]
    assert not shared_prefix_pays(lengths, groups, packed=False)  # 2 x 63 + 17 x 288 > 17 x 288
    assert shared_prefix_pays(lengths, groups, packed=True)  # packed: 2 x 7 x 63 fewer
    assert shared_prefix_pays(lengths[:16], groups[:2], packed=False)  # 2 x 63 + 16 x 65
    singles = [RowGroup(rows=(row,)) for row in range(16)]
    assert not shared_prefix_pays(lengths[:16], singles, packed=False)
    assert not shared_prefix_pays(lengths[:16], singles, packed=True)
    # end to end: a long row sharing nothing sends the padded batch down the per-row path
    rng = random.Random(5)
    batch = collate([*_grpo_items(), _row(_tokens(rng, 6), _tokens(rng, 60))])
    model = _model64()
    calls = _shared_calls(monkeypatch)
    padded = sequence_logprobs(model, batch, shared_prefix_min_tokens=MIN)[0]
    assert calls == []
    assert torch.equal(padded, sequence_logprobs(model, batch)[0])
    packed = sequence_logprobs(model, batch, packed=True, shared_prefix_min_tokens=MIN)[0]
    assert calls == [1]
    _close([packed], [sequence_logprobs(model, batch, packed=True)[0]], rtol=1e-11)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_micro_batch_computes_at_most_its_token_budget(packed: bool) -> None:
    """Every token the model runs (both calls of the shared path, or the per-row call) in a
    micro-batch the planner made stays within `micro_batch_tokens`, though the forward
    regroups the micro-batch's rows itself (a run of one row of a split group shares nothing;
    an ungrouped long row widens the rest rows) and picks the cheaper path."""
    model = tiny_llama().eval()
    tokens: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kwargs: tokens.append(int(kwargs["input_ids"].numel())),
        with_kwargs=True,
    )
    shared_runs = 0
    rng = random.Random(9)
    a, h = _tokens(rng, 10), _tokens(rng, 10)
    # group a is over 50 tokens: runs [a0] and [a1]; [a1] then shares nothing in a micro-batch
    # with group h (it runs whole: 4 rest rows of 12, not of 3)
    split = [_row(a, _tokens(rng, 30)), _row(a, _tokens(rng, 2))]
    split += [_row(h, _tokens(rng, 2)) for _ in range(3)]
    cases = [(split, (50,))]
    for seed in range(6):
        rng = random.Random(seed)
        items = [*_grpo_items(seed), *_grpo_items(seed + 10)]
        items += [_row(_tokens(rng, 5), _tokens(rng, rng.randrange(20, 40))) for _ in range(2)]
        rng.shuffle(items)
        cases.append((items, (40, 60, 90, 150)))
    for items, budgets in cases:
        batch = collate(items)
        groups = shared_prefix_groups(batch, min_tokens=MIN)
        lengths = batch.lengths_B.tolist()
        for budget in budgets:
            for micro in plan_micro_batches(lengths, budget, packed=packed, groups=groups):
                tokens.clear()
                with torch.no_grad():
                    sequence_logprobs(
                        model, batch.select(micro), packed=packed, shared_prefix_min_tokens=MIN
                    )
                shared_runs += len(tokens) == 2
                if len(micro) > 1:  # a row over the budget runs alone
                    assert sum(tokens) <= budget, (seed, budget, micro, tokens)
                # another FSDP rank shares in this pass: this one takes the shared path too,
                # at most one token (the lockstep prefix) over the budget
                tokens.clear()
                with torch.no_grad():
                    sequence_logprobs(
                        model,
                        batch.select(micro),
                        packed=packed,
                        shared_prefix_min_tokens=MIN,
                        shared_path=True,
                    )
                assert len(tokens) == 2
                if len(micro) > 1:
                    assert sum(tokens) <= budget + 1, ("forced", seed, budget, micro, tokens)
    assert shared_runs > 20  # the shared path ran in many of them


def test_a_forced_shared_pass_that_does_not_pay_runs_its_rows_whole() -> None:
    """FSDP: another rank shares in this pass, so this rank runs the shared path's two calls
    although its own groups do not pay (a long row sharing nothing widens every rest row).
    It then runs no prefix of its own, only the one-token lockstep prefix, and every row
    whole: the per-row token count (what the planner budgeted) plus one, not the prefixes'
    tokens on top (up to half as much again), with the per-row logprobs and gradients."""
    rng = random.Random(5)
    batch = collate([*_grpo_items(), _row(_tokens(rng, 6), _tokens(rng, 60))])
    groups = shared_prefix_groups(batch, min_tokens=MIN)
    lengths = [int(n) for n in batch.lengths_B.tolist()]
    model = _model64()
    tokens: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kwargs: tokens.append(int(kwargs["input_ids"].numel())),
        with_kwargs=True,
    )
    weights_BT = torch.randn(batch.input_ids_BT.shape, generator=torch.Generator().manual_seed(1))
    reference = _grads(model, batch, weights_BT.double())
    per_row = sum(tokens)
    assert per_row == len(lengths) * max(lengths)
    assert not shared_prefix_pays(lengths, groups, packed=False)
    assert shared_prefix_pays(lengths, groups, packed=True)  # packed, a group always pays
    tokens.clear()
    forced = _grads(
        model,
        batch,
        weights_BT.double(),
        shared_prefix_min_tokens=MIN,
        shared_path=True,
    )
    assert len(tokens) == 2 and tokens[0] == 1 and sum(tokens) == per_row + 1
    _close([forced[0]], [reference[0]], rtol=1e-11)
    _close(forced[2], reference[2], rtol=1e-11)


def test_micro_batch_splits_give_the_one_batch_gradient() -> None:
    model = _model64()
    batch = collate(_grpo_items())
    groups = shared_prefix_groups(batch, min_tokens=MIN)
    loss = make_grpo(entropy_coef=0.01).loss

    def gradient(plan: list[list[int]], min_tokens: int | None, packed: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        accumulate_gradients(
            model, loss, batch, plan, packed=packed, shared_prefix_min_tokens=min_tokens
        )
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole = [list(range(batch.num_sequences))]
    for packed in (False, True):
        reference = gradient(whole, None, packed)
        plan = plan_micro_batches(batch.lengths_B.tolist(), 60, packed=packed, groups=groups)
        assert 1 < len(plan) < batch.num_sequences
        _close(reference, gradient(plan, MIN, packed), rtol=1e-11)
        split_group = plan_micro_batches(batch.lengths_B.tolist(), 30, groups=groups)
        _close(reference, gradient(split_group, MIN, packed), rtol=1e-11)


def test_lora_and_reference_model_gradients_match() -> None:
    """LoRA adapters (PEFT wraps the forward) and a KL term's reference logprobs, which run
    the shared path too."""
    torch.manual_seed(0)
    model = _exact_norms(
        add_lora(tiny_llama(seed=0), rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
        .double()
        .train()
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    ref = _exact_norms(tiny_llama(seed=7).double())
    batch = collate(_grpo_items())
    loss = make_grpo(kl_beta=0.1).loss

    def gradient(min_tokens: int | None) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        accumulate_gradients(
            model,
            loss,
            batch,
            [list(range(batch.num_sequences))],
            ref_model=ref,
            shared_prefix_min_tokens=min_tokens,
        )
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    reference = gradient(None)
    assert len(reference) == 8  # the adapters only (2 layers x q, v x A, B)
    _close(reference, gradient(MIN), rtol=1e-11)


# -- the Trainer ---------------------------------------------------------------------------


def _trained(shared_prefix: bool, packing: bool) -> dict[str, torch.Tensor]:
    algorithm = make_grpo(entropy_coef=0.01)
    algorithm = RLAlgorithm(
        name="grpo", credit_assigner=ConstantCredit(value=1.0), loss=algorithm.loss
    )
    batches = [_grpo_items(seed=0), _grpo_items(seed=1)]
    config = TrainerConfig(
        lr=1e-2, micro_batch_tokens=90, packing=packing, shared_prefix=shared_prefix, seed=3
    )
    trainer = Trainer(_model64(seed=2), algorithm, ListSource(batches), config)
    trainer.run(2, progress=False)
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_a_trainer_step_gives_the_same_weights_either_way(packing: bool) -> None:
    calls: list[int] = []
    real = shared_prefix_module.shared_prefix_logprobs

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    off = _trained(shared_prefix=False, packing=packing)
    assert calls == []
    shared_prefix_module.shared_prefix_logprobs = counted  # type: ignore[assignment]
    try:
        on = _trained(shared_prefix=True, packing=packing)
    finally:
        shared_prefix_module.shared_prefix_logprobs = real  # type: ignore[assignment]
    assert calls  # used by default
    before = _model64(seed=2).state_dict()
    assert any(not torch.equal(before[k], off[k]) for k in off)  # the steps changed weights
    for key in off:
        assert torch.allclose(on[key], off[key], rtol=0, atol=1e-10), key


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_with_shared_prefixes_matches_one_process(tmp_path: Path) -> None:
    """FSDP2 on 2 gloo ranks, shared prompts run once (two forwards per micro-batch, gradients
    through the prefix KV), against one process on the per-row path."""
    from dist_worker_common import torchrun
    from dist_worker_shared_prefix import ALGORITHM, batches_for, config

    single = Trainer(tiny_llama(seed=0), ALGORITHM, ListSource(batches_for(0, 1)), config(False))
    history = single.run(2, progress=False)
    torchrun("dist_worker_shared_prefix.py", str(tmp_path))
    results = torch.load(tmp_path / "results.pt", weights_only=False, map_location="cpu")
    assert results["sharded"]
    assert all(count >= 2 for count in results["calls"])  # both ranks, both steps
    for ref, got in zip(history, results["history"], strict=True):
        assert got["num_action_tokens"] == ref["num_action_tokens"]
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7)
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    reference, start = single.model.state_dict(), tiny_llama(seed=0).state_dict()
    assert reference.keys() == results["weights"].keys()
    # Adam moves each weight by about lr (5e-3) per step whatever its gradient's size, so a
    # weight whose gradient is near zero carries float32 rounding up to ~1e-5; a wrong
    # gradient is off by the step itself.
    for name, value in reference.items():
        assert float((value - start[name]).abs().max()) > 1e-3, name
        torch.testing.assert_close(results["weights"][name], value, rtol=1e-5, atol=5e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_ranks_that_share_and_ranks_that_do_not_stay_in_lockstep(tmp_path: Path) -> None:
    """One rank has a group sharing a prompt, the other none (rows sharing nothing, or a dummy
    pass) in the same pass: the ranks agree to run the shared path together (FSDP2 gathers
    weights per model call; choosing per rank hung), and train like one process per row."""
    from dist_worker_common import torchrun
    from dist_worker_shared_prefix import ALGORITHM, MISMATCH_STEPS, batches_for, config

    batches = batches_for(0, 1, mismatch=True)
    single = Trainer(tiny_llama(seed=0), ALGORITHM, ListSource(batches), config(False))
    history = single.run(len(MISMATCH_STEPS), progress=False)
    torchrun("dist_worker_shared_prefix.py", str(tmp_path), "mismatch", timeout_s=240.0)
    results = torch.load(tmp_path / "results.pt", weights_only=False, map_location="cpu")
    assert results["sharded"]
    # both ranks ran the shared path in the 5 passes where some rank shares (1 + 2 + 2; step
    # 1's second pass, rows sharing nothing against a dummy pass, runs per row on both)
    assert results["calls"] == [5, 5]
    for ref, got in zip(history, results["history"], strict=True):
        assert got["num_action_tokens"] == ref["num_action_tokens"]
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7)
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(results["weights"][name], value, rtol=1e-5, atol=5e-5)
