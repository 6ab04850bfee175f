"""FSDP2 on 2 gloo ranks (torchrun) against the same training in one process: matching numerics
with unequal and empty per-rank batches, and checkpoints resumed on another world size (2 -> 1
and 1 -> 2) with bit-identical weights and optimizer state after loading."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_worker_common import ALGORITHM, batches_for, torchrun, trainer_config
from training_fakes import ListSource, tiny_llama
from transformers import AutoModelForCausalLM

from ludic.training import Trainer, read_checkpoint

pytestmark = pytest.mark.distributed

STEP3 = "step_00000003"


def _single_process(checkpoint_dir: Path, model_seed: int = 0) -> Trainer:
    source = ListSource(batches_for(0, 1))
    return Trainer(tiny_llama(seed=model_seed), ALGORITHM, source, trainer_config(checkpoint_dir))


def _state(trainer: Trainer) -> dict[str, Any]:
    return {
        "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),  # live tensors otherwise
    }


_TWO_GPUS = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)


@pytest.fixture(
    scope="module",
    params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, _TWO_GPUS])],
)
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The single-process CPU reference (4 steps, checkpoint at 3), then one 2-rank launch on
    gloo (cpu) or NCCL (cuda)."""
    device = request.param
    root = tmp_path_factory.mktemp(f"fsdp-{device}")
    single = _single_process(root / "single")
    history = single.run(3, progress=False)
    step3 = _state(single)
    history += single.run(1, progress=False)
    reference = {"history": history, "step3": step3, "step4": _state(single)}
    torchrun("dist_worker_fsdp.py", str(root / "dist"), str(root / "single" / STEP3), device)
    results = torch.load(root / "dist" / "results.pt", weights_only=False, map_location="cpu")
    # Two ranks sum their halves of each gradient, one process sums it whole: float32 rounding
    # differs, and Adam's per-element normalisation lets weights whose gradients are near zero
    # move by a few 1e-6 after four steps; anything structural is far larger.
    tolerance = {"rel": 1e-5, "atol": 5e-6} if device == "cpu" else {"rel": 1e-4, "atol": 1e-4}
    return {"root": root, "single": reference, "dist": results, "tol": tolerance}


def _assert_close_states(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: dict[str, float]
) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(
            a[name],
            b[name],
            atol=tol["atol"],
            rtol=tol["rel"],
            msg=lambda m, name=name: f"{name}: {m}",
        )


def _assert_equal_optimizer(
    a: dict[str, Any], b: dict[str, Any], *, exact: bool, tol: dict[str, float] | None = None
) -> None:
    assert a["state"].keys() == b["state"].keys()
    for index, moments in a["state"].items():
        for key, value in moments.items():
            other = b["state"][index][key]
            if exact:
                assert torch.equal(value, other), (index, key)
            else:
                assert tol is not None
                torch.testing.assert_close(value, other, atol=tol["atol"], rtol=tol["rel"])
    assert _groups(a) == _groups(b)


def _groups(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Param groups with tuples as lists (DCP's round trip turns `betas` into a list)."""
    return [
        {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
        for g in state["param_groups"]
    ]


def test_fsdp_steps_match_single_process(runs: dict[str, Any]) -> None:
    single, dist, tol = runs["single"], runs["dist"], runs["tol"]
    assert dist["sharded"], "the 2-rank model was not sharded (FSDP2 not chosen under torchrun)"
    for ref, got in zip(single["history"], dist["history"], strict=True):
        assert got["num_action_tokens"] == ref["num_action_tokens"]  # summed over ranks
        counts = [k for k in ref if k.startswith(("num_samples", "dropped_", "policy_lag/"))]
        assert {k: got[k] for k in counts} == {k: ref[k] for k in counts}  # so are the samples
        assert got["loss"] == pytest.approx(ref["loss"], rel=tol["rel"], abs=1e-7)
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=tol["rel"])
        assert got["policy_version"] == ref["policy_version"]
    _assert_close_states(single["step4"]["weights"], dist["step4"]["weights"], tol)
    optimizers = single["step3"]["optimizer"], dist["step3"]["optimizer"]
    _assert_equal_optimizer(*optimizers, exact=False, tol=tol)


def test_rank_with_empty_batch_still_steps(runs: dict[str, Any]) -> None:
    # Step 2: rank 1 had no samples; it ran dummy passes and both ranks applied the update.
    step2 = runs["dist"]["history"][1]
    assert "skipped_empty" not in step2 and step2["policy_version"] == 2.0
    assert step2["num_micro_batches"] >= 1
    # Step 3: ranks had different micro-batch counts; the larger count ran on both.
    assert runs["dist"]["history"][2]["num_micro_batches"] > 1


def test_nan_on_one_rank_skips_the_step_on_every_rank(runs: dict[str, Any]) -> None:
    histories = runs["dist"]["nan_histories"]
    assert len(histories) == 2
    for history in histories:  # rank 0's loss was finite: it skipped because rank 1's was not
        assert history[0]["skipped_nonfinite"] == 1.0 and history[0]["policy_version"] == 0.0
        assert "skipped_nonfinite" not in history[1] and history[1]["policy_version"] == 1.0
    assert runs["dist"]["nan_unchanged"]


def test_resume_two_ranks_on_one_is_bit_identical(runs: dict[str, Any]) -> None:
    path = runs["root"] / "dist" / "ckpt" / STEP3
    assert read_checkpoint(path).rank_states is not None  # both ranks' RNG and data position
    resumed = _single_process(runs["root"] / "resumed_single", model_seed=123)
    assert resumed.resume(path) == 3
    assert resumed.batch_source.position == 3  # type: ignore[attr-defined]
    saved = runs["dist"]["step3"]
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, saved["weights"][name]), name
    _assert_equal_optimizer(resumed.optimizer.state_dict(), saved["optimizer"], exact=True)
    # Training continues, on one process now, like the 2-rank run did.
    step4 = resumed.run(1, progress=False)[0]
    tol = runs["tol"]
    assert step4["loss"] == pytest.approx(runs["dist"]["history"][3]["loss"], rel=tol["rel"])
    _assert_close_states(_state(resumed)["weights"], runs["dist"]["step4"]["weights"], tol)
    # The exported model is a plain Hugging Face checkpoint.
    exported = AutoModelForCausalLM.from_pretrained(path / "model")
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, saved["weights"][name]), name


def test_resume_one_rank_on_two_is_bit_identical(runs: dict[str, Any]) -> None:
    dist, single = runs["dist"], runs["single"]
    assert dist["resumed_step"] == 3 and dist["resumed_position"] == 3
    for name, tensor in single["step3"]["weights"].items():
        assert torch.equal(dist["loaded"]["weights"][name], tensor), name
    _assert_equal_optimizer(dist["loaded"]["optimizer"], single["step3"]["optimizer"], exact=True)
    assert dist["caller_dict_unchanged"]
    got = dist["resumed_history"][0]
    assert got["loss"] == pytest.approx(single["history"][3]["loss"], rel=runs["tol"]["rel"])
    _assert_close_states(single["step4"]["weights"], dist["resumed_step4"]["weights"], runs["tol"])
