"""A LoRA policy's own base as its KL reference (`ref_model=model.get_base_model()`) runs as
the policy with its adapters disabled: the reference logprobs are the base model's (before and
after the adapters train, with dropout off), and no second model is made or frozen. It was
refused as sharing the policy's parameters, so a LoRA run with a KL term kept a full copy of
the base. A reference that is the LoRA model itself is still refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from dist_worker_common import batches_for, lora_model, torchrun
from dist_worker_ref import ALGORITHM as REF_ALGORITHM
from dist_worker_ref import config
from training_fakes import ListSource, mixed_items, params_snapshot, tiny_llama

from ludic.training import (
    ConstantCredit,
    LossInputs,
    LossOutput,
    RLAlgorithm,
    Trainer,
    TrainerConfig,
    add_lora,
    make_grpo,
)
from ludic.training.collate import collate
from ludic.training.logprobs import sequence_logprobs

pytest.importorskip("peft")

BATCHES = [mixed_items(3, seed=1), mixed_items(2, seed=2)]


class RecordingKL:
    """GRPO with a KL term, keeping each micro-batch's policy and reference logprobs."""

    def __init__(self) -> None:
        self.loss = make_grpo(kl_beta=0.5).loss
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def needs_ref_logprobs(self) -> bool:
        return True

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        assert inputs.ref_logprobs_BT is not None
        self.seen.append((inputs.logprobs_BT.detach().clone(), inputs.ref_logprobs_BT.clone()))
        return self.loss(inputs)


def lora_with_dropout() -> torch.nn.Module:
    """The tiny Llama (attention dropout 0.5: a reference run in train mode would be noisy)
    with LoRA adapters whose B is non-zero, so the policy differs from its base at once."""
    model = add_lora(tiny_llama(seed=0, dropout=0.5), rank=4, alpha=8, target_modules=("q_proj",))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05, generator=torch.Generator().manual_seed(3))
    return model


def base_logprobs(batch_items: list) -> torch.Tensor:
    base = tiny_llama(seed=0, dropout=0.5).eval()
    with torch.no_grad():
        return sequence_logprobs(base, collate(batch_items))[0]


def test_the_own_base_reference_is_the_base_without_a_copy() -> None:
    model = lora_with_dropout()
    loss = RecordingKL()
    algorithm = RLAlgorithm(name="grpo_kl", credit_assigner=ConstantCredit(value=1.0), loss=loss)
    base_before = {k: v for k, v in params_snapshot(model).items() if "lora_" not in k}
    adapters_before = {k: v for k, v in params_snapshot(model).items() if "lora_" in k}
    trainer = Trainer(
        model,
        algorithm,
        ListSource(BATCHES),
        TrainerConfig(lr=1e-2, max_grad_norm=None),
        ref_model=model.get_base_model(),
    )
    assert trainer.ref_model is trainer.model  # no second model
    trainer.run(2, progress=False)
    assert trainer.model.training  # the reference forward left the policy in train mode
    after = params_snapshot(trainer.model)
    assert any(not torch.equal(after[k], v) for k, v in adapters_before.items())  # trained
    assert all(torch.equal(after[k], v) for k, v in base_before.items())  # base untouched
    assert [p.requires_grad for n, p in model.named_parameters() if "lora_" in n] == [True] * 4
    # step 1 before any update, step 2 after the adapters moved: the reference is the base's
    for (policy_BT, ref_BT), items in zip(loss.seen, BATCHES, strict=True):
        torch.testing.assert_close(ref_BT, base_logprobs(items), atol=1e-6, rtol=0)
        assert not torch.allclose(policy_BT, ref_BT, atol=1e-4)  # the adapters count


def test_a_copy_of_the_base_still_serves_as_reference() -> None:
    base = tiny_llama(seed=0)
    reference = copy.deepcopy(base)
    model = add_lora(base, rank=4, alpha=8, target_modules=("q_proj",))
    loss = RecordingKL()
    algorithm = RLAlgorithm(name="grpo_kl", credit_assigner=ConstantCredit(value=1.0), loss=loss)
    trainer = Trainer(model, algorithm, ListSource(BATCHES), TrainerConfig(), ref_model=reference)
    assert trainer.ref_model is reference
    trainer.run(1, progress=False)
    torch.testing.assert_close(loss.seen[0][1], base_logprobs(BATCHES[0]), atol=1e-6, rtol=0)


def test_the_lora_model_itself_as_reference_is_refused() -> None:
    model = lora_with_dropout()
    algorithm = RLAlgorithm(
        name="kl", credit_assigner=ConstantCredit(value=1.0), loss=RecordingKL()
    )
    with pytest.raises(ValueError, match=r"shares \d+ parameters.*model.get_base_model\(\)"):
        Trainer(model, algorithm, ListSource(BATCHES), TrainerConfig(), ref_model=model)


@pytest.mark.distributed
def test_the_own_base_reference_on_two_fsdp_ranks_matches_a_copy_in_one_process(
    tmp_path: Path,
) -> None:
    single = lora_model()  # the reference: a copy of the same base (tiny_llama(seed=0))
    trainer = Trainer(
        single,
        REF_ALGORITHM,
        ListSource(batches_for(0, 1)),
        config("plain"),
        ref_model=tiny_llama(),
    )
    want = trainer.run(4, progress=False)
    torchrun("dist_worker_lora_reference.py", str(tmp_path))
    got = torch.load(tmp_path / "results.pt", weights_only=False)
    assert got["no_copy"]
    for ref, dist in zip(want, got["history"], strict=True):
        assert dist["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7)
        assert dist["loss/kl_ref/kl_ref"] == pytest.approx(
            ref["loss/kl_ref/kl_ref"], rel=1e-4, abs=1e-8
        )
