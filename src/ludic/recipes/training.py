"""Small helpers the recipes and examples share: a Trainer with a JSONL metrics log and
checkpoints in one output directory, loading a policy, choosing in-process or server
inference (with the matching weight publisher), and a curve plot.

Plain functions over public components; they add no behaviour of their own.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedModel

from ludic.distributed import InProcessPublisher, PolicyPublisher
from ludic.inference.client import ChatClient
from ludic.training import (
    BatchSource,
    CheckpointConfig,
    JsonlLogger,
    RLAlgorithm,
    Trainer,
    TrainerConfig,
)

METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"


def make_trainer(
    model: torch.nn.Module,
    tokenizer: Any,
    algorithm: RLAlgorithm,
    source: BatchSource,
    *,
    out: Path,
    lr: float,
    seed: int = 0,
    publisher: PolicyPublisher | None = None,
    initial_policy_version: int = 0,
    checkpoint_every: int | None = None,
    micro_batch_tokens: int | None = None,
    device: str = "cpu",
) -> Trainer:
    """A Trainer logging to `out/metrics.jsonl` and checkpointing under `out/checkpoints`
    (every `checkpoint_every` steps, the last two kept; the tokenizer is saved with the model
    so a checkpoint's `model/` directory loads with `ludic.models.load_model`)."""
    out.mkdir(parents=True, exist_ok=True)
    config = TrainerConfig(
        lr=lr,
        seed=seed,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        initial_policy_version=initial_policy_version,
        max_lag=0 if publisher is not None else None,
        micro_batch_tokens=micro_batch_tokens,
        device=device,
        checkpoint=CheckpointConfig(
            dir=str(out / CHECKPOINTS_DIR), every_n_steps=checkpoint_every, keep_last=2
        ),
    )
    return Trainer(
        model,
        algorithm,
        source,
        config,
        publisher=publisher,
        logger=JsonlLogger(out / METRICS_FILE),
        tokenizer=tokenizer,
    )


def finish(trainer: Trainer) -> Path:
    """Save a final checkpoint (unless this step was just saved) and close the logger."""
    assert trainer.checkpoints is not None
    path = trainer.checkpoints.path_for(trainer.step)
    if not trainer.checkpoints.due(trainer.step) or not path.exists():
        path = trainer.save_checkpoint()
    trainer.close()
    return path


def load_policy(model: str | None, *, seed: int = 0, device: str = "cpu") -> tuple[Any, Any]:
    """(model in fp32, tokenizer): a fresh tiny model (None), a local model directory, or a
    Hugging Face hub id such as "Qwen/Qwen2.5-0.5B-Instruct" (downloaded by transformers, so
    it needs network; Ludic itself never fetches anything)."""
    from ludic.models import build_tiny_model, load_model

    if model is None:
        return build_tiny_model(seed=seed)
    if Path(model).is_dir():
        return load_model(model, dtype=torch.float32, device=device)
    if Path(model).exists() or model.count("/") != 1:
        raise ValueError(
            f"--model {model!r} is neither a local model directory nor a hub id like "
            "'org/name'; pass the directory that holds config.json"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    loaded.to(device)  # type: ignore[arg-type]  # transformers' decorated `to` confuses mypy
    return loaded.eval(), AutoTokenizer.from_pretrained(model)


@dataclass(kw_only=True, slots=True)
class Inference:
    """Where rollouts are generated (`client`) and how new weights get there (`publisher`)."""

    client: ChatClient
    publisher: PolicyPublisher

    async def aclose(self) -> None:
        """Close the client (an HTTP connection pool, or the embedded engine's worker)."""
        aclose = getattr(self.client, "aclose", None)
        if aclose is not None:
            await aclose()
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


def make_inference(
    model: PreTrainedModel,
    tokenizer: Any,
    *,
    server_url: str | None = None,
    server_token: str | None = None,
    served_model: str = "default",
    device: str = "cpu",
) -> Inference:
    """The embedded engine on a copy of `model` with an in-process publisher, or, with
    `server_url`, an OpenAI-compatible client plus a `BroadcastPolicyPublisher` pushing
    weights to that server's control endpoints (gloo from CPU, NCCL from a CUDA device).
    Create it inside the event loop that will use it (the HTTP client is bound to it)."""
    if server_url is None:
        from ludic.inference.engine import EmbeddedEngine

        engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
        return Inference(client=engine, publisher=InProcessPublisher(engine))
    if not server_token:
        raise ValueError(
            "a server URL needs its control token to push weights (start it with "
            "`ludic serve --model DIR --token SECRET` and pass the same token)"
        )
    from ludic.distributed import BroadcastPolicyPublisher
    from ludic.inference.openai_client import OpenAICompatibleClient

    backend: Literal["gloo", "nccl"] = "nccl" if device.startswith("cuda") else "gloo"
    publisher = BroadcastPolicyPublisher(
        server_url, server_token, backend=backend, probe_model=model
    )
    return Inference(
        client=OpenAICompatibleClient(server_url, model=served_model), publisher=publisher
    )


def plot_curve(metrics_jsonl: Path, png: Path, key: str, *, smooth: float = 0.6) -> Path:
    """Plot `key` against step from a metrics JSONL into `png` (with an EMA over raw values)."""
    from ludic.viz import plot_metrics

    plot_metrics(metrics_jsonl, png, keys=(key,), smooth=smooth)
    return png
