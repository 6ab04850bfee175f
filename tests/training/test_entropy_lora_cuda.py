"""Training features checked only on the CPU so far, on a GPU (CI has no GPU: `-m "not gpu"`
skips them): token entropies of the tempered, top-p-filtered distribution (the entropy bonus,
`loss/entropy/entropy`), a LoRA model's own base as KL reference (adapters disabled, no copy),
and `add_lora(seed=...)` on a model already on the GPU (it forks that device's RNG only).

The rows are sampled from the tiny model itself at temperature 0.7, top_p 0.9 (its lm_head
scaled so top-p cuts the vocabulary to a few tokens), so they are on-policy. The same
computations on the CPU in float32 are the reference. Tolerances: float32 on the GPU agrees
with the CPU to 1e-4 per token (summation order only); bf16 autocast to 0.05 nats on average
per token (bf16 rounds the logits by ~1e-2; a token on the nucleus boundary may fall on the
other side, which moves that token's entropy by up to ~0.2).

`LUDIC_TEST_GPU_DEVICE=cpu` runs the same path on a CPU box (how the tests were checked
before they ran on a GPU)."""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from training_fakes import VOCAB, ListSource, tiny_llama

from ludic.inference.embedded.token_sampling import RowKnobs
from ludic.rollouts.samples import SAWItem
from ludic.training import CheckpointConfig, Trainer, TrainerConfig, add_lora, make_grpo
from ludic.training.collate import collate
from ludic.training.logprobs import sequence_logprobs

DEVICE = os.environ.get("LUDIC_TEST_GPU_DEVICE", "cuda")
"""The device under test; `LUDIC_TEST_GPU_DEVICE=cpu` runs the same path without a GPU."""

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA GPU"
    ),
]

SAMPLING = {"temperature": 0.7, "top_k": -1, "top_p": 0.9}
DTYPES = ["float32", "bfloat16"]
PER_TOKEN_TOL = {"float32": 1e-4, "bfloat16": 5e-2}
"""How far the device's logprobs / entropies may be from the CPU's float32 ones: per token in
float32, on average over the action tokens in bf16 (see the module docstring)."""


def peaked_llama(seed: int = 3) -> torch.nn.Module:
    """The tiny Llama with its logits scaled up 40x: top_p 0.9 then keeps a few tokens of 300
    (unscaled, its distribution is near uniform and the filter changes little)."""
    model = tiny_llama(seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model


def sampled_rows(model: torch.nn.Module, count: int = 6, seed: int = 0) -> list[SAWItem]:
    """`count` rows of 3 prompt tokens and 6-8 completion tokens drawn from `model` on the CPU
    at SAMPLING, with their behaviour logprobs, weights alternating +1 / -1."""
    knobs = RowKnobs.of([SAMPLING["temperature"]], [SAMPLING["top_k"]], [SAMPLING["top_p"]], VOCAB)
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        ids = torch.randint(1, VOCAB, (3,), generator=generator).tolist()
        logprobs = [0.0] * len(ids)
        for _ in range(6 + i % 3):
            with torch.no_grad():
                logits_1V = model(input_ids=torch.tensor([ids])).logits[:, -1]
            lp_V = knobs.logprobs(logits_1V.float())[0]
            token = int(torch.multinomial(lp_V.exp(), 1, generator=generator))
            ids.append(token)
            logprobs.append(float(lp_V[token]))
        rows.append(
            SAWItem(
                input_ids=tuple(ids),
                action_mask=tuple(0 if t < 3 else 1 for t in range(len(ids))),
                weight=1.0 if i % 2 == 0 else -1.0,
                behavior_logprobs=tuple(logprobs),
                meta={"policy_versions": [], "behavior_sampling": SAMPLING},
            )
        )
    return rows


def logprobs_and_entropies(
    model: torch.nn.Module, rows: list[SAWItem], device: str, dtype: str = "float32"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The action tokens' logprobs and entropies as the Trainer computes them, on `device`
    (the model moves there), under bf16 autocast for `dtype="bfloat16"`."""
    batch = collate(rows).to(device)
    autocast = torch.autocast(
        torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"
    )
    with torch.no_grad(), autocast:
        logprobs_BT, entropy_BT = sequence_logprobs(model.to(device), batch, with_entropy=True)
    assert entropy_BT is not None
    actions_BT = batch.action_mask_BT > 0
    return logprobs_BT[actions_BT].cpu(), entropy_BT[actions_BT].cpu()


def behaviour_logprobs(rows: list[SAWItem]) -> torch.Tensor:
    return torch.tensor(
        [
            logprob
            for row in rows
            for logprob, action in zip(row.behavior_logprobs or (), row.action_mask, strict=True)
            if action
        ]
    )


def assert_near(got: torch.Tensor, want: torch.Tensor, dtype: str) -> None:
    tolerance = PER_TOKEN_TOL[dtype]
    if dtype == "float32":
        torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
    else:
        assert float((got - want).abs().mean()) < tolerance, (got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tempered_filtered_entropies_and_logprobs_on_the_device_match_the_cpu(dtype: str) -> None:
    model = peaked_llama()
    rows = sampled_rows(model)
    cpu_logprobs, cpu_entropies = logprobs_and_entropies(model, rows, "cpu")
    unfiltered = [replace(row, meta={"policy_versions": []}) for row in rows]
    _, temperature_1 = logprobs_and_entropies(model, unfiltered, "cpu")
    # the transform matters here: the sampled distribution's entropy is well below the model's
    assert float(cpu_entropies.mean()) < float(temperature_1.mean()) - 0.3
    torch.testing.assert_close(cpu_logprobs, behaviour_logprobs(rows), atol=1e-4, rtol=0)

    logprobs, entropies = logprobs_and_entropies(copy.deepcopy(model), rows, DEVICE, dtype)
    assert bool(torch.isfinite(logprobs).all() and torch.isfinite(entropies).all())
    assert_near(logprobs, cpu_logprobs, dtype)
    assert_near(entropies, cpu_entropies, dtype)


def entropy_run(device: str, dtype: str, rows: list[SAWItem]) -> list[dict[str, float]]:
    """3 steps of GRPO with a strong entropy bonus on rows of weight 0 (the bonus alone moves
    the model), at a learning rate where the tempered entropy rises step by step."""
    config = TrainerConfig(lr=3e-4, device=device, dtype=dtype)  # type: ignore[arg-type]
    trainer = Trainer(peaked_llama(), make_grpo(entropy_coef=0.5), ListSource([rows]), config)
    return trainer.run(3, progress=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_entropy_bonus_on_the_device_raises_the_sampled_entropy_as_on_the_cpu(
    dtype: str,
) -> None:
    rows = [replace(row, weight=0.0) for row in sampled_rows(peaked_llama())]
    _, entropies = logprobs_and_entropies(peaked_llama(), rows, "cpu")
    on_cpu = entropy_run("cpu", "float32", rows)
    on_device = entropy_run(DEVICE, dtype, rows)
    # the metric is the token mean of the tempered, filtered entropies (not temperature 1's)
    assert on_cpu[0]["loss/entropy/entropy"] == pytest.approx(float(entropies.mean()), rel=1e-5)
    assert (
        on_device[0]["loss/mismatch/abs_log_ratio_max"] < {"float32": 1e-3, "bfloat16": 0.5}[dtype]
    )  # on-policy at step 1
    tolerance = {"float32": 1e-3, "bfloat16": PER_TOKEN_TOL["bfloat16"]}[dtype]
    for cpu_step, device_step in zip(on_cpu, on_device, strict=True):
        assert torch.isfinite(torch.tensor([device_step["loss"], device_step["grad_norm"]])).all()
        for key in ("loss", "loss/entropy/entropy"):
            assert device_step[key] == pytest.approx(cpu_step[key], rel=tolerance, abs=tolerance)
    entropy = [step["loss/entropy/entropy"] for step in on_device]
    assert entropy[0] < entropy[1] < entropy[2], entropy  # the bonus pushes the right way


def lora_policy(device: str, seed: int = 0) -> torch.nn.Module:
    """The peaked Llama on `device`, then LoRA adapters drawn from `seed` (the order a user
    loading a model onto the GPU takes)."""
    return add_lora(peaked_llama().to(device), rank=4, alpha=8, seed=seed)


def lora_kl_trainer(device: str, dtype: str, rows: list[SAWItem], out: Path | None) -> Trainer:
    """GRPO with a KL term to the LoRA policy's own base (adapters disabled), checkpointing
    every step into `out` when given."""
    model = lora_policy(device)
    config = TrainerConfig(
        lr=1e-3,
        device=device,
        dtype=dtype,  # type: ignore[arg-type]
        checkpoint=None if out is None else CheckpointConfig(dir=str(out), every_n_steps=1),
    )
    algorithm = make_grpo(kl_beta=0.5)
    return Trainer(model, algorithm, ListSource([rows]), config, ref_model=model.get_base_model())


def adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if "lora_" in n}


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if "lora_" not in n}


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_lora_run_on_the_device_with_its_base_as_kl_reference(dtype: str) -> None:
    rows = sampled_rows(peaked_llama())
    want = lora_kl_trainer("cpu", "float32", rows, None).run(3, progress=False)
    trainer = lora_kl_trainer(DEVICE, dtype, rows, None)
    assert trainer.ref_model is trainer.model  # the base is the policy, adapters off: no copy
    base_before = base_weights(trainer.model)
    got = trainer.run(3, progress=False)
    # step 1: B = 0, so the policy is its base and the KL term is zero. Allowed: the k3 of
    # rounding noise (~1e-5 logprobs in float32, ~1e-2 in bf16 should the no-grad reference
    # forward take another attention kernel); any other reference gives a KL above 1e-3
    zero = {"float32": 1e-9, "bfloat16": 2.5e-4}[dtype]
    assert got[0]["loss/kl_ref/kl_ref"] == pytest.approx(0.0, abs=zero)
    assert all(step["loss/kl_ref/kl_ref"] > 1e-4 for step in got[1:]), got  # adapters moved
    assert trainer.model.training  # the reference forward left the policy in train mode
    assert all(torch.equal(base_weights(trainer.model)[n], w) for n, w in base_before.items())
    rel, abs_ = {"float32": (1e-3, 1e-5), "bfloat16": (PER_TOKEN_TOL["bfloat16"],) * 2}[dtype]
    for cpu_step, device_step in zip(want, got, strict=True):
        assert torch.isfinite(torch.tensor([device_step["loss"], device_step["grad_norm"]])).all()
        for key in ("loss", "loss/kl_ref/kl_ref"):
            assert device_step[key] == pytest.approx(cpu_step[key], rel=rel, abs=abs_)


def device_rng_state() -> torch.Tensor:
    if torch.device(DEVICE).type == "cuda":
        return torch.cuda.get_rng_state(DEVICE)
    return torch.get_rng_state()


def test_a_seeded_lora_run_on_the_device_reproduces_and_resumes(tmp_path: Path) -> None:
    """Two processes' random starts (torch seeded differently before the model is built) draw
    the same adapters from `add_lora(seed=0)` on a model on the GPU, leaving the GPU's RNG as
    it was; a run stopped at step 2 and resumed to 4 equals an uninterrupted one."""
    rows = sampled_rows(peaked_llama())
    drawn = []
    for start in (1, 2):
        torch.manual_seed(start)  # seeds every device's RNG
        state = device_rng_state()
        drawn.append(adapters(lora_policy(DEVICE)))
        assert torch.equal(device_rng_state(), state)
    assert drawn[0].keys() == drawn[1].keys() and any("lora_A" in n for n in drawn[0])
    assert all(torch.equal(drawn[0][n], drawn[1][n]) for n in drawn[0])

    torch.manual_seed(1)
    whole = lora_kl_trainer(DEVICE, "float32", rows, None)
    want = whole.run(4, progress=False)
    torch.manual_seed(2)
    got = lora_kl_trainer(DEVICE, "float32", rows, tmp_path / "ckpt").run(2, progress=False)
    torch.manual_seed(3)
    resumed = lora_kl_trainer(DEVICE, "float32", rows, tmp_path / "ckpt")
    resumed.resume()
    assert resumed.step == 2
    got += resumed.run(2, progress=False)
    # on a GPU, attention's backward may add in another order: float noise, not bit equality
    # (adapters drawn from another seed move the loss and KL by 3-20% from step 2 on)
    for want_step, got_step in zip(want, got, strict=True):
        for key in ("loss", "loss/kl_ref/kl_ref"):
            assert got_step[key] == pytest.approx(want_step[key], rel=1e-3, abs=1e-6)
    for name, weight in adapters(whole.model).items():
        torch.testing.assert_close(adapters(resumed.model)[name], weight, atol=1e-4, rtol=1e-3)
