"""Under FSDP2 the Trainer shards a plain reference model itself, and eval_fn runs on every rank.

A reference model given unsharded (a copy of each rank's start policy) used to stay a full
replica on every rank, with each rank's own weights: the policy starts from rank 0's weights
(broadcast), but a reference whose initialisation differed per rank did not, so the KL term
compared each rank against a different model (the first step's KL was not 0) and no error
said so. Now it is sharded frozen from rank 0's weights, and one already sharded is kept.
An `eval_fn` running the sharded model works on every rank and is logged once (by the rank
with the logger); given to rank 0 alone it used to hang the job (rank 0's forward waited for
rank 1's all-gather forever), as would a reference model on rank 0 alone: both are refused
on every rank. (One process keeps a plain reference as given, frozen: test_trainer.py.)
A reference that shares parameters with the policy (the model itself, a LoRA model itself) is
refused on any number of ranks: freezing it froze the policy and the run died on "optimizer
got an empty parameter list" (a LoRA model's own base is the model with its adapters disabled:
test_lora_reference.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_worker_common import ALGORITHM as NLL
from dist_worker_common import batches_for, lora_model, torchrun
from dist_worker_ref import ALGORITHM, config
from dist_worker_ref_auto import EVAL_EVERY, eval_config, held_out_eval
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import Trainer


@pytest.mark.slow
@pytest.mark.distributed
def test_plain_reference_model_is_sharded_from_rank_0_and_matches_one_process(
    tmp_path: Path,
) -> None:
    steps = batches_for(0, 1)
    single = Trainer(
        tiny_llama(seed=0), ALGORITHM, ListSource(steps), config("plain"), ref_model=tiny_llama(0)
    )
    history = single.run(len(steps), progress=False)
    torchrun("dist_worker_ref_auto.py", str(tmp_path), "ref", timeout_s=120.0)
    got = torch.load(tmp_path / "results.pt", weights_only=False, map_location="cpu")
    assert got["ref_sharded"] == [True, True]
    assert got["ref_frozen"]
    assert got["ref_local_numel"] < got["ref_numel"]  # a share, not a replica
    assert got["ref_calls"][0] == got["ref_calls"][1] >= len(steps)  # dummy passes included
    assert got["presharded_kept"] == [True, True]  # not sharded a second time
    # the reference is the start policy on both ranks: rank 0's weights, not rank 1's own
    assert got["history"][0]["loss/kl_ref/kl_ref"] == 0.0
    for ref, step in zip(history, got["history"], strict=True):
        assert step["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7)
        assert step["loss/kl_ref/kl_ref"] == pytest.approx(
            ref["loss/kl_ref/kl_ref"], rel=1e-4, abs=1e-7
        )
        assert step["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    assert history[-1]["loss/kl_ref/kl_ref"] > 0.0  # the term did its work
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(got["weights"][name], value, rtol=1e-5, atol=5e-4)


@pytest.mark.slow
@pytest.mark.distributed
def test_eval_fn_runs_the_sharded_model_on_every_rank_and_is_refused_on_one(
    tmp_path: Path,
) -> None:
    steps = [
        [*mixed_items(3, seed=1), *mixed_items(3, seed=2)],
        [*mixed_items(2, seed=5), *mixed_items(2, seed=6)],
    ] * 2
    single = Trainer(
        tiny_llama(seed=0), NLL, ListSource(steps), eval_config(), eval_fn=held_out_eval
    )
    history = single.run(len(steps), progress=False)
    want = {i + 1: m["eval/logprob"] for i, m in enumerate(history) if "eval/logprob" in m}
    assert list(want) == [EVAL_EVERY, 2 * EVAL_EVERY]
    torchrun("dist_worker_ref_auto.py", str(tmp_path), "eval", timeout_s=120.0)
    got = torch.load(tmp_path / "results.pt", weights_only=False, map_location="cpu")
    seen = {i + 1: m["eval/logprob"] for i, m in enumerate(got["history"]) if "eval/logprob" in m}
    assert seen == pytest.approx(want, rel=1e-5)  # the sharded forward: one process's values
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2, 3, 4]  # one line per step: rank 0's
    assert {row["step"]: row["eval/logprob"] for row in logged if "eval/logprob" in row} == seen
    for errors, name in ((got["eval_error"], "eval_fn"), (got["ref_error"], "ref_model")):
        for error in errors:  # both ranks, before any forward
            assert error is not None and f"{name} only on ranks [0]" in error, errors
    assert "trainer.runtime.is_main" in got["eval_error"][1]
    assert "shard" in got["ref_error"][0]


@pytest.mark.parametrize("shared", ["model", "lora_model"])
def test_reference_sharing_the_policy_parameters_is_refused(shared: str) -> None:
    model = tiny_llama(seed=0) if shared == "model" else lora_model()
    ref = model
    with pytest.raises(ValueError, match=r"ref_model shares \d+ parameters.*copy.deepcopy"):
        Trainer(model, ALGORITHM, ListSource(batches_for(0, 1)), config("plain"), ref_model=ref)
    assert any(p.requires_grad for p in model.parameters())  # the policy is left trainable
