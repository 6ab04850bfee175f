"""Which collective a weight push can use between a trainer and its inference servers.

NCCL joins processes on different GPUs. It cannot join two processes on one GPU (NCCL refuses
the group: "Duplicate GPU detected") nor reach a server whose model is on the CPU. Servers say
where their model lives in `GET /ludic/weights/status` (`device`, and `device_uuid` for a GPU),
so a CUDA trainer pushes over NCCL only where NCCL can work, and otherwise over gloo (through
host memory: slower, but it works), saying why. A server that does not report its device
(vLLM's extension) keeps NCCL, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ludic.distributed.transfer import Backend


def device_identity(device: torch.device | str) -> dict[str, str | None]:
    """`{"device": "cuda:0", "device_uuid": "GPU-..."}` (the UUID None off the GPU): what a
    server reports in its weight-sync status."""
    device = torch.device(device)
    uuid = None
    if device.type == "cuda" and torch.cuda.is_available():
        uuid = gpu_uuid(device)
    return {"device": str(device), "device_uuid": uuid}


def gpu_uuid(device: torch.device) -> str:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(index).uuid)


def push_backend(
    trainer_device: torch.device | str,
    server_statuses: Mapping[str, Mapping[str, Any]],
    *,
    trainer_uuid: str | None = None,
    server_setting: str = "the server URL",
) -> tuple[Backend, str | None]:
    """The backend for a push from `trainer_device` to servers whose weight-sync statuses are
    `server_statuses` (url -> status), and why it is not NCCL where the trainer is on a GPU
    (None when there is nothing to say). `trainer_uuid` defaults to the device's own UUID;
    `server_setting` is how the reason names the setting that points the trainer at servers,
    as the caller's user gave it (`--server-url` for a command, `server_url=` from Python)."""
    device = torch.device(trainer_device)
    if device.type != "cuda":
        return "gloo", None
    if trainer_uuid is None and torch.cuda.is_available():
        trainer_uuid = gpu_uuid(device)
    for url, status in server_statuses.items():
        served_on = status.get("device")
        if served_on is None:  # it does not say (vLLM's extension): NCCL, as before
            continue
        if not str(served_on).startswith("cuda"):
            return "gloo", (
                f"server {url} serves on {served_on}, which NCCL cannot reach: weights go "
                "over gloo through host memory"
            )
        if trainer_uuid is not None and status.get("device_uuid") == trainer_uuid:
            return "gloo", (
                f"server {url} is on the trainer's GPU ({trainer_uuid}) and NCCL cannot join "
                "two processes on one GPU: weights go over gloo through host memory (slower; "
                "start the server on another GPU, e.g. CUDA_VISIBLE_DEVICES=1, for NCCL, or "
                f"drop {server_setting} to serve from the trainer's process)"
            )
    return "nccl", None
