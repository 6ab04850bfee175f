"""The Trainer's GPU options where CUDA is present (CI has no GPU: `-m "not gpu"` skips them):
`TrainerConfig(compile=True, fused_adamw=True)` (inductor's GPU kernels) and the shared-prompt
forward step like the plain eager Trainer on the same GPU, with parameters laid out in one
storage as when publishing. The CLI paths on a GPU: tests/recipes/test_train_cuda.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from training_fakes import ListSource, shared_prompt_group, tiny_llama

from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize(
    "options",
    [{"compile": True, "fused_adamw": True}, {"shared_prefix": True}, {"dtype": "bfloat16"}],
    ids=["compile_fused", "shared_prefix", "bf16_autocast"],
)
def test_gpu_options_step_like_the_plain_trainer(options: dict[str, object]) -> None:
    rows = shared_prompt_group(6, [14, 17, 12, 15], 60) + shared_prompt_group(
        4, [9, 12, 20, 11], 70
    )
    trainers = []
    for extra in ({}, options):
        config = TrainerConfig(lr=1e-2, device="cuda", contiguous_parameters=True, **extra)  # type: ignore[arg-type]
        model = tiny_llama(seed=2).to("cuda")
        trainers.append(Trainer(model, make_grpo(), ListSource([rows]), config))
    tolerance = 5e-2 if options.get("dtype") == "bfloat16" else 1e-3
    for _ in range(3):
        plain, other = (t.run(1, progress=False)[0]["loss"] for t in trainers)
        assert torch.isfinite(torch.tensor(other))
        assert other == pytest.approx(plain, rel=tolerance, abs=1e-4)
    for (name, got), want in zip(
        trainers[1].model.state_dict().items(),
        trainers[0].model.state_dict().values(),
        strict=True,
    ):
        assert got.device.type == "cuda"
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance, msg=name)


def test_fused_adamw_resumes_a_checkpoint_saved_without_it(tmp_path: Path) -> None:
    """Torch puts a loaded `step` where the saved (non-fused) groups keep it, on the CPU; the
    fused CUDA kernel then refused the step ("Expected all tensors to be on the same device")."""
    rows = shared_prompt_group(4, [9, 12, 20, 11], 30)

    def trainer(**options: object) -> Trainer:
        config = TrainerConfig(
            lr=1e-3,
            device="cuda",
            checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=1),
            **options,  # type: ignore[arg-type]
        )
        return Trainer(tiny_llama(seed=0).to("cuda"), make_grpo(), ListSource([rows]), config)

    trainer().run(1, progress=False)
    fused = trainer(fused_adamw=True)
    fused.resume()
    fused.run(1, progress=False)
    assert fused.step == 2
    assert all(s["step"].device.type == "cuda" for s in fused.optimizer.state.values())
