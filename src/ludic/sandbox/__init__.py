"""Sandboxed execution of untrusted (model-written) code: limits on time, CPU, memory,
processes, file size and output; no network; a private scratch directory as the only writable
place; no access to the trainer's environment or files.

Backends: `BubblewrapBackend` (preferred), `RestrictedSubprocessBackend` (fallback, weaker,
reported in every result's `isolation`), `ContainerBackend` (Docker / Podman). `SandboxPool`
adds a concurrency limit and a result cache; `shared_pool()` is the per-event-loop default. Nothing here imports torch.
"""

from ludic.sandbox.bubblewrap import BubblewrapBackend, default_python
from ludic.sandbox.container import ContainerBackend
from ludic.sandbox.pool import SandboxPool, cache_key, detect_backend, shared_pool
from ludic.sandbox.records import (
    SandboxBackend,
    SandboxLimits,
    SandboxResult,
    classify_exit,
)
from ludic.sandbox.restricted import RestrictedSubprocessBackend

__all__ = [
    "BubblewrapBackend",
    "ContainerBackend",
    "RestrictedSubprocessBackend",
    "SandboxBackend",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "cache_key",
    "classify_exit",
    "default_python",
    "detect_backend",
    "shared_pool",
]
