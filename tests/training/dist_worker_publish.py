"""Launched by test_fsdp_publish.py under torchrun (2 gloo ranks). Usage:
`dist_worker_publish.py OUT_DIR SERVER_URL TOKEN MODEL_DIR`

Every rank builds what `ludic learner` builds: a `BroadcastPolicyPublisher(probe_model=model)`
to a `ludic serve` server (verification on), and a Trainer that shards the model with FSDP2 and
publishes after every step (the full state is gathered on every rank, rank 0 pushes and
verifies). 1. Full fine-tuning, 2 steps (versions 1, 2). 2. LoRA on the same base, 2 steps
(versions 3, 4: merged weights). After each phase rank 0 records the version, the gathered
(merged) weights it published and what the server reported holding, to OUT_DIR/results.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from dist_worker_common import ALGORITHM, batches_for
from training_fakes import ListSource

from ludic.distributed import BroadcastPolicyPublisher
from ludic.models import load_model
from ludic.training import Trainer, TrainerConfig, add_lora
from ludic.training.parallel import FSDPRuntime


def _source() -> ListSource:
    return ListSource(batches_for(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))[:2])


def _phase(
    model: torch.nn.Module, url: str, token: str, first_version: int, runtime: object = None
) -> tuple[Trainer, dict[str, object]]:
    publisher = BroadcastPolicyPublisher(
        url,
        token,
        timeout_s=60,
        probe_model=model,
        probe_every=1,  # every push: the twin
    )
    config = TrainerConfig(
        lr=5e-3, micro_batch_tokens=32, seed=11, initial_policy_version=first_version
    )
    trainer = Trainer(
        model,
        ALGORITHM,
        _source(),
        config,
        publisher=publisher,
        runtime=runtime,  # type: ignore[arg-type]
    )
    assert isinstance(trainer.runtime, FSDPRuntime)
    history = trainer.run(2, progress=False)
    published = trainer.runtime.inference_weights(trainer.model)  # gathered (and merged)
    result: dict[str, object] = {"history": history, "version": trainer.policy_version}
    if trainer.runtime.is_main:
        assert isinstance(published, dict) and publisher.last_push is not None
        result["weights"] = {k: v.detach().clone() for k, v in published.items()}
        result["held_checksums"] = publisher.last_push.held_checksums
        result["verify_seconds"] = publisher.last_push.verify_seconds
        publisher.close()
    return trainer, result


def main() -> None:
    out_dir, url, token, model_dir = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    model, _ = load_model(model_dir, dtype=torch.float32)
    first, full = _phase(model, url, token, first_version=0)
    base, _ = load_model(model_dir, dtype=torch.float32)
    lora = add_lora(base, rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:  # non-zero: the adapters change the outputs from the start
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
                param.mul_(0.02)
    _, adapted = _phase(lora, url, token, first_version=2, runtime=first.runtime)
    if first.runtime.is_main:
        torch.save({"full": full, "lora": adapted}, out_dir / "results.pt")
    first.close()


if __name__ == "__main__":
    main()
