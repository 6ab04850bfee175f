"""`TrainerConfig(compile=True)` / `ludic.training.compiled` and `TrainerConfig(fused_adamw=True)`:
which modules compile, refusals with the fix in the message, the same logprobs and gradients as
eager on every forward path (padded, packed, shared prefix) with one set of compiled graphs for
every length (no recompiles), and a Trainer with both options stepping like the default one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters
from training_fakes import ListSource, shared_prompt_group, tiny_llama

from ludic.training import Trainer, TrainerConfig, collate, make_grpo
from ludic.training.compiled import (
    compile_for_training,
    compile_trainer_model,
    compiled_regions,
)
from ludic.training.logprobs import sequence_logprobs


def test_regions_are_every_mlp_and_rmsnorm() -> None:
    names = [name for name, _ in compiled_regions(tiny_llama())]
    assert names == [
        "model.layers.0.mlp",
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.mlp",
        "model.layers.1.input_layernorm",
        "model.layers.1.post_attention_layernorm",
        "model.norm",
    ]


def test_a_model_without_regions_is_refused() -> None:
    with pytest.raises(ValueError, match="nothing to compile, turn compile off"):
        compile_for_training(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_compile_is_refused_under_fsdp() -> None:
    model = tiny_llama()
    with pytest.raises(ValueError, match=r"2 ranks under FSDP2.*set compile=False"):
        compile_trainer_model(model, world_size=2)
    assert all(module._compiled_call_impl is None for _, module in compiled_regions(model))


CASES = [  # (rows, sequence_logprobs options): lengths and paths vary
    (shared_prompt_group(6, [14, 17, 12, 15], 0), {"shared_prefix_min_tokens": 4}),
    (shared_prompt_group(5, [9, 23, 11], 10), {"shared_prefix_min_tokens": 4}),
    (shared_prompt_group(6, [14, 17, 12, 15], 20), {}),
    (shared_prompt_group(3, [7, 19], 30), {}),
    (shared_prompt_group(6, [13, 8, 16], 40), {"packed": True}),
    (shared_prompt_group(6, [10, 21], 50), {"packed": True, "shared_prefix_min_tokens": 4}),
]


@pytest.mark.slow
def test_compiled_matches_eager_on_every_path_without_recompiling() -> None:
    eager = tiny_llama(seed=1).train()
    compiled = copy.deepcopy(eager)
    names = compile_for_training(compiled)
    assert len(names) == 7
    before = counters["stats"]["unique_graphs"]
    graphs = []
    for rows, options in CASES:
        batch = collate(rows, pad_token_id=0)
        results = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            logprobs_BT, _ = sequence_logprobs(model, batch, **options)
            (logprobs_BT * batch.advantages_B[:, None]).sum().backward()
            results.append((logprobs_BT.detach(), [p.grad for p in model.parameters()]))
        graphs.append(counters["stats"]["unique_graphs"])
        (lp_eager, grads_eager), (lp_compiled, grads_compiled) = results
        torch.testing.assert_close(lp_compiled, lp_eager, atol=2e-5, rtol=1e-5)
        for got, want in zip(grads_compiled, grads_eager, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # the first batch compiled (the MLP and norm graphs); no later length or path recompiled
    assert graphs[0] - before >= 2
    assert graphs[-1] == graphs[0], f"recompiled for new shapes: graphs after each case {graphs}"


@pytest.mark.slow
def test_trainer_with_compile_and_fused_adamw_steps_like_the_default() -> None:
    rows = shared_prompt_group(6, [14, 17, 12, 15], 60) + shared_prompt_group(
        4, [9, 12, 20, 11], 70
    )
    trainers = []
    for options in ({}, {"compile": True, "fused_adamw": True}):
        config = TrainerConfig(
            lr=1e-2,
            shared_prefix=True,
            contiguous_parameters=True,  # as when publishing: parameters are views of one buffer
            **options,  # type: ignore[arg-type]
        )
        source = ListSource([rows])
        trainers.append(Trainer(tiny_llama(seed=2), make_grpo(), source, config))
    default, fast = trainers
    assert fast.optimizer.defaults["fused"] is True
    assert default.optimizer.defaults["fused"] is None
    assert all(m._compiled_call_impl is not None for _, m in compiled_regions(fast.model))
    for _ in range(3):
        losses = [t.run(1, progress=False)[0]["loss"] for t in trainers]
        assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-6)
    assert list(fast.model.state_dict()) == list(default.model.state_dict())  # no _orig_mod.
    changed = False
    for (name, got), want in zip(
        fast.model.state_dict().items(), default.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=name)
        changed |= not torch.equal(want, tiny_llama(seed=2).state_dict()[name])
    assert changed  # the steps trained
