"""FSDP2 ranks stay in lockstep when their work is uneven: a rank with no samples, or fewer
micro-batches, runs dummy passes that make the same collectives as the others' real passes.

With a reference model that is itself sharded (a KL term): every pass, dummy ones included,
runs the reference forward on every rank (its all-gathers), on the per-row path, on the
shared-prefix path and packed (without gradient clipping). Without that the ranks'
collectives drift apart and the job hangs; the worker then dumps its stacks and exits, and
the launcher kills what is left by pid. Also: a rank whose data ends first stops every rank,
and batch-invariant mode on a sharded model fails on every rank with a clear error.
(LoRA, gradient clipping, nan losses and empty ranks: test_fsdp.py and test_lora.py; ranks
that share prompts and ranks that do not: test_shared_prefix.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_worker_common import torchrun
from dist_worker_ref import ALGORITHM, REF_SEED, config, steps_for
from training_fakes import ListSource, tiny_llama

from ludic.training import Trainer, accumulate_gradients, collate

REF_MODES = ("plain", "shared", "packed")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of the one torchrun that runs every sharded-reference mode, then the
    lockstep cases (dist_worker_lockstep.py): a launch costs more than a run."""
    out = tmp_path_factory.mktemp("lockstep")
    torchrun("dist_worker_lockstep.py", str(out), *REF_MODES, timeout_s=300.0)
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["per_row", "shared_path"])
def test_dummy_passes_run_the_reference_model_like_real_passes(shared: bool) -> None:
    """One process, the model calls counted: a rank padding 1 micro-batch to 3 passes calls the
    reference model 3 times (twice per pass on the shared path), as often as the policy."""
    model, ref = tiny_llama(seed=0), tiny_llama(seed=REF_SEED)
    calls: dict[str, int] = {"policy": 0, "ref": 0}
    for name, module in (("policy", model), ("ref", ref)):
        module.register_forward_pre_hook(
            lambda *_, name=name: calls.__setitem__(name, calls[name] + 1)
        )
    batch = collate(steps_for("shared", 0, 1)[0])
    accumulate_gradients(
        model,
        ALGORITHM.loss,
        batch,
        [list(range(batch.num_sequences))],
        num_passes=3,
        ref_model=ref,
        shared_prefix_min_tokens=4 if shared else None,
        shared_passes=[shared] * 3 if shared else None,
    )
    per_pass = 2 if shared else 1
    assert calls == {"policy": 3 * per_pass, "ref": 3 * per_pass}
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("mode", REF_MODES)
def test_sharded_reference_model_with_uneven_ranks_matches_one_process(
    mode: str, launched: Path
) -> None:
    steps = steps_for(mode, 0, 1)
    single = Trainer(
        tiny_llama(seed=0),
        ALGORITHM,
        ListSource(steps),
        config(mode),
        ref_model=tiny_llama(seed=REF_SEED),
    )
    history = single.run(len(steps), progress=False)
    results = torch.load(launched / mode / "results.pt", weights_only=False, map_location="cpu")
    assert results["sharded"]
    calls = results["ref_calls"]
    assert calls[0] == calls[1] and calls[0] >= len(steps)
    for ref, got in zip(history, results["history"], strict=True):
        assert got["num_action_tokens"] == ref["num_action_tokens"]
        assert got["loss/kl_ref/kl_ref"] != 0.0
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7)
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
        # loss terms and train/inference mismatch stats: shares summed over ranks (a rank
        # with no samples adds none), equal to one process's
        terms = {k: v for k, v in ref.items() if k.startswith("loss/")}
        assert terms == pytest.approx({k: got[k] for k in terms}, rel=1e-4, abs=1e-6)
        assert ("loss/mismatch/tokens" in got) == (mode == "plain")  # behaviour logprobs
    # Adam moves each weight by about lr (5e-3) per step whatever its gradient's size, so a
    # weight whose gradient is near zero carries float32 rounding up to ~1e-4 (the shared
    # path sums over rows in another order); a wrong gradient is off by the step itself.
    start = tiny_llama(seed=0).state_dict()
    for name, value in single.model.state_dict().items():
        assert float((value - start[name]).abs().max()) > 1e-3, name
        torch.testing.assert_close(results["weights"][name], value, rtol=1e-5, atol=5e-4)


@pytest.mark.slow
@pytest.mark.distributed
def test_uneven_data_ends_and_uneven_setups_stop_every_rank(launched: Path) -> None:
    """Rank 0's source runs out a step before rank 1's: both stop after the step they shared
        (rank 1 went on alone and hung in the step's all-reduce). Batch-invariant mode on a sharded
        model: both ranks get the same clear error (one of them has only a dummy pass); so does a
    checkpoint manager on rank 0 only (every rank gathers what rank 0 writes). A source that
    fails on one rank (a lost connection) stops the other too, naming why."""
    ranks = torch.load(launched / "results.pt", weights_only=False, map_location="cpu")
    assert len(ranks) == 2
    for results in ranks:
        assert results["exhausted"] == {"steps": 1, "trainer_step": 1, "policy_version": 1}
        error = results["invariant_error"]
        assert error is not None and "FSDP-sharded" in error and "batch_invariant off" in error
        error = results["checkpoint_error"]
        assert error is not None and "checkpoint_manager only on ranks [0]" in error
        assert results["failed_step"] == 1  # the step both ranks had data for
    assert ranks[1]["failed_error"] == "ConnectionError: lost the stream"
    assert ranks[0]["failed_error"] == (
        "RankFailedError: rank 1 failed while fetching the batch of step 2: ConnectionError: "
        "lost the stream; rank 0 stops with it (rank 1's output has the traceback)"
    )
