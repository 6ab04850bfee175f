"""SandboxPool: the front door for running untrusted code. A concurrency limit, a result
cache keyed by sha256 of (argv, files, stdin, limits, isolation), deduplication of identical
runs in flight, and lazy choice of the best backend that works here.

It deliberately keeps no warm sandboxes: measured on a 2-core box, a bubblewrap run costs
50-150 ms, nearly all of it process and interpreter start-up, while claiming a uid and making
the scratch directory cost about 7 ms, so pre-creating them would save little.

At construction a pool says loudly (a `SandboxIsolationWarning`, also logged) when this host
cannot give the strongest isolation: no bubblewrap (runs fall back to the restricted
subprocess), or no memory cgroup (each run is held to one process so that `memory_bytes` still
caps the whole run). Every result names its `isolation` and `memory_scope`.

Cached results are returned as first seen (`cached=True`): code that prints random numbers is
not re-run (pass `use_cache=False` for that). Wall-time and process-cap outcomes, and deaths
by a signal no limit explains, are never cached (they depend on the host); a sandbox that
never ran the program raises `SandboxStartError`, and nothing is cached. A pool serves one
event loop at a time: used under one `asyncio.run` and then another, it moves to the new loop;
two loops running at once (threads) are refused, as they would split its concurrency limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from ludic.sandbox.bubblewrap import BubblewrapBackend
from ludic.sandbox.cgroup import MemoryCgroups, find_memory_cgroups
from ludic.sandbox.records import (
    SandboxBackend,
    SandboxIsolationWarning,
    SandboxLimits,
    SandboxResult,
)
from ludic.sandbox.restricted import RestrictedSubprocessBackend

PYTHON_FILE = "main.py"
_log = logging.getLogger("ludic.sandbox")


def isolation_gaps(backend: SandboxBackend | None = None) -> list[str]:
    """What keeps sandboxed runs here (on `backend`, or the one a pool would pick) from the
    strongest isolation, each with what to install or enable; empty when nothing does."""
    gaps = []
    if backend is None and shutil.which("bwrap") is None:
        gaps.append(
            "bubblewrap (bwrap) is not installed, so runs fall back to the weaker "
            "restricted-subprocess backend (shared host filesystem, no mount or pid "
            "isolation, no scratch quota); install it: apt-get install bubblewrap"
        )
    elif isinstance(backend, RestrictedSubprocessBackend):
        gaps.append(
            "the restricted-subprocess backend is weaker than bubblewrap: "
            + "; ".join(backend.weaknesses)
        )
    scope = getattr(backend, "memory_scope", None)
    if backend is None or scope == "process":
        found = getattr(backend, "memory_cgroups", None) or find_memory_cgroups()
        if not isinstance(found, MemoryCgroups):
            gaps.append(
                "no memory cgroup can be made here, so memory_bytes cannot cap all of a "
                "run's processes together: each run is held to ONE process (forks and "
                f"threads fail) instead. Why: {found}"
            )
        elif scope == "process":
            gaps.append("this backend was built without a memory cgroup (memory_cgroups=None)")
    return gaps


_detected: dict[tuple[str | None, bool], SandboxBackend] = {}


async def detect_backend(
    *, python: str | None = None, allow_weak: bool = True, use_cached: bool = True
) -> SandboxBackend:
    """Bubblewrap when it works here, else the restricted subprocess (logged as weaker).

    The answer is remembered for the process (backends hold no event-loop state), so
    creating many pools is cheap; `use_cached=False` probes afresh and remembers nothing. Raises RuntimeError when
    nothing works, or when bubblewrap fails and `allow_weak` is False.
    """
    key = (python, allow_weak)
    if not use_cached:
        return await _detect(python, allow_weak)
    if key not in _detected:
        _detected[key] = await _detect(python, allow_weak)
    return _detected[key]


async def _detect(python: str | None, allow_weak: bool) -> SandboxBackend:
    strong = BubblewrapBackend(python=python)
    problem = await strong.probe()
    if problem is None:
        return strong
    if not allow_weak:
        raise RuntimeError(f"no strong sandbox available: {problem}")
    weak = RestrictedSubprocessBackend(python=python)
    weak_problem = await weak.probe()
    if weak_problem is not None:
        raise RuntimeError(f"no sandbox works here: {problem}; and {weak_problem}")
    return weak


def cache_key(
    argv: Sequence[str],
    files: Mapping[str, bytes],
    stdin: bytes,
    limits: SandboxLimits,
    isolation: str,
) -> str:
    """sha256 over everything that determines a run's result."""
    payload = {
        "argv": list(argv),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
        "stdin": hashlib.sha256(stdin).hexdigest(),
        "limits": limits.to_dict(),
        "isolation": isolation,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class SandboxPool:
    """Runs programs on one backend, at most `max_concurrency` at a time.

    `backend=None` picks one on first use with `detect_backend` (`allow_weak=False` refuses
    the restricted-subprocess fallback); a given backend is probed on first use and refused
    (RuntimeError, naming why) when it cannot run programs here. `cache_size=0` disables the cache. Warns
    (`SandboxIsolationWarning`) at construction about every `isolation_gaps` of this host.
    """

    def __init__(
        self,
        backend: SandboxBackend | None = None,
        *,
        limits: SandboxLimits | None = None,
        max_concurrency: int = 4,
        cache_size: int = 4096,
        allow_weak: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.limits = limits or SandboxLimits()
        self.max_concurrency = max_concurrency
        self.cache_size = cache_size
        self.hits = 0
        self.misses = 0
        self.allow_weak = allow_weak
        self._backend = backend
        self._probed = False
        for gap in isolation_gaps(backend):
            _log.warning("ludic.sandbox: %s", gap)
            warnings.warn(f"ludic.sandbox: {gap}", SandboxIsolationWarning, stacklevel=2)
        self._cache: OrderedDict[str, SandboxResult] = OrderedDict()
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None  # bound at first use
        self._backend_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._in_flight: dict[str, asyncio.Future[SandboxResult]] = {}

    def _bind_to_running_loop(self) -> None:
        """Give the pool locks of the loop running now (asyncio locks belong to the loop that
        first waits on them: a second `asyncio.run` got "bound to a different event loop" for
        every run that had to wait for a slot). Runs in flight on a stopped loop are dropped;
        the cache is kept."""
        loop = asyncio.get_running_loop()
        bound = self._loop() if self._loop is not None else None
        if bound is loop:
            return
        if bound is not None and bound.is_running():
            raise RuntimeError(
                "this SandboxPool is in use by another running event loop (another thread); "
                "give each event loop its own SandboxPool (shared_pool() does)"
            )
        if self._loop is not None:
            self._backend_lock = asyncio.Lock()
            self._slots = asyncio.Semaphore(self.max_concurrency)
            self._in_flight = {}
        self._loop = weakref.ref(loop)

    async def backend(self) -> SandboxBackend:
        """The backend runs go to: the one given, probed on first use (a backend that cannot
        run here is refused, naming why, instead of failing every run; the probe also settles
        what it adapts to the host, e.g. the restricted backend's network namespace), or the
        best one `detect_backend` finds."""
        self._bind_to_running_loop()
        async with self._backend_lock:
            if self._backend is None:
                self._backend = await detect_backend(allow_weak=self.allow_weak)
            elif not self._probed:
                problem = await self._backend.probe()
                if problem is not None:
                    raise RuntimeError(
                        f"the sandbox backend given to SandboxPool "
                        f"({type(self._backend).__name__}) cannot run programs here: {problem}. "
                        "Fix that, or give no backend (SandboxPool() picks one that works)"
                    )
            self._probed = True
            return self._backend

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes | str = b"",
        limits: SandboxLimits | None = None,
        use_cache: bool = True,
    ) -> SandboxResult:
        """Run `argv` in a fresh sandbox holding `files` (see `SandboxBackend.run`)."""
        backend = await self.backend()
        files = dict(files or {})
        stdin_bytes = stdin.encode() if isinstance(stdin, str) else stdin
        limits = limits or self.limits
        if not use_cache or self.cache_size == 0:
            return await self._run(backend, argv, files, stdin_bytes, limits)
        isolation = f"{backend.isolation}/{getattr(backend, 'memory_scope', '')}"
        key = cache_key(argv, files, stdin_bytes, limits, isolation)
        if key in self._cache:
            self.hits += 1
            self._cache.move_to_end(key)
            return dataclasses.replace(self._cache[key], cached=True)
        task = self._in_flight.get(key)
        if task is not None:  # an identical run is under way: share its result
            self.hits += 1
            return dataclasses.replace(await asyncio.shield(task), cached=True)
        self.misses += 1
        # The run is its own task so that a cancelled caller does not cancel it for the
        # others waiting on it; the limits bound how long it can outlive every caller.
        task = asyncio.ensure_future(self._run(backend, argv, files, stdin_bytes, limits))
        self._in_flight[key] = task
        task.add_done_callback(lambda t: self._finish(key, t))
        return await asyncio.shield(task)

    def _finish(self, key: str, task: asyncio.Future[SandboxResult]) -> None:
        if self._in_flight.get(key) is task:  # not when a new event loop took over meanwhile
            del self._in_flight[key]
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if not _depends_on_host(result):
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    async def run_python(
        self,
        code: str,
        *,
        stdin: bytes | str = b"",
        limits: SandboxLimits | None = None,
        use_cache: bool = True,
    ) -> SandboxResult:
        """Run Python source as the script `main.py` in the sandbox's working directory."""
        backend = await self.backend()
        return await self.run(
            [backend.python, PYTHON_FILE],
            files={PYTHON_FILE: code.encode("utf-8")},
            stdin=stdin,
            limits=limits,
            use_cache=use_cache,
        )

    async def _run(
        self,
        backend: SandboxBackend,
        argv: Sequence[str],
        files: Mapping[str, bytes],
        stdin: bytes,
        limits: SandboxLimits,
    ) -> SandboxResult:
        async with self._slots:
            return await backend.run(argv, files=files, stdin=stdin, limits=limits)


def _depends_on_host(result: SandboxResult) -> bool:
    """Whether the same run may end otherwise next time, so its result is not cached: the wall
    time and the process cap depend on host load (when not root, the cap counts every process
    of the shared uid), and a signal no limit explains may come from outside the program (the
    host's OOM killer, an operator, a sandbox process that crashed); re-running a program that
    kills itself costs one run."""
    unexplained_signal = result.killed_signal is not None and result.limit_hit is None
    return result.timed_out or result.processes_exceeded or unexplained_signal


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SandboxPool] = (
    weakref.WeakKeyDictionary()
)


def shared_pool() -> SandboxPool:
    """The default pool of the running event loop, shared by every env and tool that was
    given none: one cache, and at most one sandbox per CPU at a time."""
    loop = asyncio.get_running_loop()
    if loop not in _shared:
        _shared[loop] = SandboxPool(max_concurrency=os.cpu_count() or 1)
    return _shared[loop]
