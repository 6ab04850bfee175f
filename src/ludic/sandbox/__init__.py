"""Sandboxed execution of untrusted (model-written) code: limits on time, CPU, memory (for the
whole run: every process and every byte it stores, where a memory cgroup can be made),
processes, file size, scratch size and output; no network; size-capped tmpfs mounts as the only
writable places; no access to the trainer's environment or files.

Backends: `BubblewrapBackend` (preferred), `RestrictedSubprocessBackend` (fallback, weaker,
reported in every result's `isolation`), `ContainerBackend` (Docker / Podman). `SandboxPool`
adds a concurrency limit and a result cache; `shared_pool()` is the per-event-loop default. Nothing here imports torch.
"""

from ludic.sandbox.bubblewrap import BubblewrapBackend, default_python
from ludic.sandbox.cgroup import MemoryCgroups, find_memory_cgroups
from ludic.sandbox.container import ContainerBackend
from ludic.sandbox.pool import (
    SandboxPool,
    cache_key,
    detect_backend,
    isolation_gaps,
    shared_pool,
)
from ludic.sandbox.records import (
    SandboxBackend,
    SandboxIsolationWarning,
    SandboxLimits,
    SandboxResult,
    SandboxStartError,
    classify_exit,
)
from ludic.sandbox.restricted import RestrictedSubprocessBackend

__all__ = [
    "BubblewrapBackend",
    "ContainerBackend",
    "MemoryCgroups",
    "RestrictedSubprocessBackend",
    "SandboxBackend",
    "SandboxIsolationWarning",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "SandboxStartError",
    "cache_key",
    "classify_exit",
    "default_python",
    "detect_backend",
    "find_memory_cgroups",
    "isolation_gaps",
    "shared_pool",
]
