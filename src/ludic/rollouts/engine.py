"""RolloutEngine: the stateless factory floor that turns requests into rollouts.

For each request it builds a fresh env and protocol from registered factories, runs the episode
concurrently with the others (a concurrency limit and a per-episode timeout), stamps rollout
meta, and closes the env. It does not assign credit or build samples (see `batch.py`), and it
never lets one episode's failure abort the batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ludic._resumed_log import ResumedLog, batch_index_of, meta_batch_index
from ludic.envs.base import EnvCloseError, LudicEnv, close_env
from ludic.inference.http.affinity import conversation
from ludic.interaction.base import InteractionProtocol
from ludic.rollouts.requests import RolloutRequest
from ludic.rollouts.rollout_log import append_rollouts_jsonl, set_aside_earlier_log
from ludic.types import Rollout

EnvFactory = Callable[..., LudicEnv]
ProtocolFactory = Callable[..., InteractionProtocol]

logger = logging.getLogger(__name__)


class RolloutEngine:
    """Runs one episode per `RolloutRequest`, concurrently.

    - `env_registry` / `protocol_registry`: `{name: factory}`; a request's `env.name` picks the
      factory, called as `factory(**env.kwargs)` (same for the protocol).
    - `concurrency`: episodes in flight at once. `episode_timeout_s`: wall-clock limit per
      episode (None: no limit).
    - `jsonl_log`: append every rollout (failed ones included) to this file as episodes finish.
      A rollout that cannot be written is logged and gets `meta["log_error"]`; never raised.
      One engine's rollouts make one run: when this engine's first rollout has no
      `meta["batch_index"]` (rollouts outside a training batch source), a non-empty file an
      earlier run left there is renamed to a dated name beside it (`set_aside_earlier_log`,
      said in a warning), so a rerun writes a fresh file instead of mixing two runs. When it
      has one (`RolloutBatchSource` stamps it: a training run, perhaps resumed), the file is
      continued: its records of that batch and later ones, and a line cut off mid-write, are
      dropped, since a run resumed from a checkpoint replays them (see `ludic._resumed_log`).
    - `progress`: show a progress bar (tqdm) over episodes.

    Rollout meta gets the request's `meta`, then the protocol's own keys, then `request_id`,
    `group_id`, `env_seed`, `sampling_seed`, `env_name`, `protocol_name`. A failed episode
    (a factory, the env, the client, the parser or the protocol raised, it timed out, it
    raised CancelledError without the batch being cancelled, or `env.close()` raised or
    outlasted the env's `close_timeout_s`) becomes one rollout with no steps and
    `meta["error"]`, `meta["error_type"]`, `meta["error_phase"]` ("env_factory",
    "protocol_factory", "run", "timeout" or "close"), and, when code raised, the last
    frames of its traceback in `meta["error_traceback"]`; the first such traceback of a batch
    is logged once (each failure gets one line). Only cancelling `run` itself cancels.
    Synchronous env methods run on worker threads, so the timeout bounds them too (see
    `LudicEnv`); the engine closes every env it built (after the protocol, which may already
    have), outside the episode timeout.
    """

    def __init__(
        self,
        *,
        env_registry: Mapping[str, EnvFactory],
        protocol_registry: Mapping[str, ProtocolFactory],
        concurrency: int = 32,
        episode_timeout_s: float | None = None,
        jsonl_log: str | Path | None = None,
        progress: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"RolloutEngine.concurrency must be >= 1, got {concurrency}")
        if episode_timeout_s is not None and episode_timeout_s <= 0:
            raise ValueError(
                f"RolloutEngine.episode_timeout_s must be > 0 or None, got {episode_timeout_s}"
            )
        self.env_registry = dict(env_registry)
        self.protocol_registry = dict(protocol_registry)
        _check_factories(self.env_registry, "env_registry", "env")
        _check_factories(self.protocol_registry, "protocol_registry", "protocol")
        self.concurrency = concurrency
        self.episode_timeout_s = episode_timeout_s
        self.jsonl_log = None if jsonl_log is None else Path(jsonl_log)
        self._resumed_log: ResumedLog | None = None
        self.progress = progress

    async def run(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Run every request; rollouts come back in request order (a request may yield several,
        e.g. one per agent)."""
        self._check_names(requests)
        semaphore = asyncio.Semaphore(self.concurrency)
        traceback_logged = False
        with tqdm(total=len(requests), desc="rollouts", disable=not self.progress) as bar:

            async def one(request: RolloutRequest) -> list[Rollout]:
                async with semaphore:
                    with conversation(request.request_id):  # a pooled client keeps it on one server
                        rollouts = await self._run_episode(request)
                nonlocal traceback_logged
                if not traceback_logged:
                    traceback_logged = _log_first_traceback(request, rollouts)
                if self.jsonl_log is not None:
                    self._log(rollouts)
                bar.update(1)
                return rollouts

            per_request = await asyncio.gather(*(one(r) for r in requests))
        rollouts = [r for rollouts in per_request for r in rollouts]
        warn_if_all_failed(rollouts)
        return rollouts

    def _check_names(self, requests: Sequence[RolloutRequest]) -> None:
        for request in requests:
            if request.env.name not in self.env_registry:
                raise KeyError(
                    f"request {request.request_id} names env {request.env.name!r}, which is not "
                    f"registered; registered envs: {sorted(self.env_registry)}"
                )
            if request.protocol.name not in self.protocol_registry:
                raise KeyError(
                    f"request {request.request_id} names protocol {request.protocol.name!r}, "
                    f"which is not registered; registered protocols: "
                    f"{sorted(self.protocol_registry)}"
                )

    async def _run_episode(self, request: RolloutRequest) -> list[Rollout]:
        started = time.perf_counter()
        built: list[LudicEnv] = []
        try:
            rollouts = await self._guarded_episode(request, built)
        finally:  # a cancelled batch still closes its envs
            close_error = await _close_env(built[0] if built else None)
        if close_error is not None and not any(r.failed for r in rollouts):
            logger.warning(
                "episode %s failed (close): EnvCloseError: %s", request.request_id, close_error
            )
            rollouts = [_failed_rollout("EnvCloseError", close_error, "close")]
        elapsed = time.perf_counter() - started
        for rollout in rollouts:
            _stamp(rollout, request, elapsed_s=elapsed, close_error=close_error)
        return rollouts

    async def _guarded_episode(
        self, request: RolloutRequest, built: list[LudicEnv]
    ) -> list[Rollout]:
        """The episode's rollouts, or one failed rollout saying why; only a cancellation of
        the batch itself propagates."""
        phase = "env_factory"
        trace: str | None = None
        deadline: asyncio.Timeout | None = None
        try:
            async with asyncio.timeout(self.episode_timeout_s) as deadline:
                env = self.env_registry[request.env.name](**request.env.kwargs)
                _check_built_env(env, request.env.name)
                built.append(env)
                phase = "protocol_factory"
                protocol = self.protocol_registry[request.protocol.name](**request.protocol.kwargs)
                phase = "run"
                rollouts = await protocol.run(
                    env, env_seed=request.env_seed, sampling=request.episode_sampling()
                )
                if not rollouts:
                    raise ValueError(
                        f"protocol {request.protocol.name!r} returned no rollouts; a protocol "
                        "returns at least one Rollout per episode"
                    )
                return rollouts
        except asyncio.CancelledError as e:
            if _batch_cancelled():
                raise
            error_type, message = (
                "CancelledError",
                (
                    f"the episode raised CancelledError ({e!r}) although the batch was not "
                    "cancelled: something it awaited was cancelled"
                ),
            )
        except Exception as e:
            error_type, message = type(e).__name__, str(e) or repr(e)
            trace = "".join(traceback.format_exception(e, limit=-_TRACEBACK_FRAMES))
            if isinstance(e, TimeoutError) and deadline is not None and deadline.expired():
                error_type, phase = "TimeoutError", "timeout"
                message = f"episode exceeded episode_timeout_s={self.episode_timeout_s}"
                trace = None  # where the deadline struck, not a fault in the code
            elif isinstance(e, EnvCloseError):
                phase = "close"
        logger.warning(
            "episode %s failed (%s): %s: %s", request.request_id, phase, error_type, message
        )
        return [_failed_rollout(error_type, message, phase, trace)]

    def _log(self, rollouts: Sequence[Rollout]) -> None:
        """Append to `jsonl_log`; a rollout that cannot be written gets `meta["log_error"]`
        (counted in `BatchStats.num_log_failures`) and the batch goes on."""
        assert self.jsonl_log is not None
        if self._resumed_log is None or self._resumed_log.path != self.jsonl_log:
            self._resumed_log = ResumedLog(self.jsonl_log, batch_index_of)
            if rollouts and meta_batch_index(rollouts[0].meta) is None:
                self._start_fresh_log(self.jsonl_log)
        for rollout in rollouts:
            try:
                self._resumed_log.before_write(meta_batch_index(rollout.meta))
                append_rollouts_jsonl([rollout], self.jsonl_log)
            except Exception as e:
                logger.error(
                    "could not write rollout %s to jsonl_log %s: %s: %s",
                    rollout.id,
                    self.jsonl_log,
                    type(e).__name__,
                    e,
                )
                rollout.meta["log_error"] = f"{type(e).__name__}: {e}"

    @staticmethod
    def _start_fresh_log(path: Path) -> None:
        """Keep an earlier run's rollouts at `path` under a dated name (a warning says where);
        a rename that fails is logged and this run appends after them."""
        try:
            kept = set_aside_earlier_log(path)
        except OSError as e:
            logger.error(
                "jsonl_log %s holds an earlier run's rollouts and could not be renamed aside "
                "(%s: %s); this run's rollouts follow them in the file",
                path,
                type(e).__name__,
                e,
            )
            return
        if kept is not None:
            logger.warning(
                "jsonl_log %s held an earlier run's rollouts: kept as %s; this run writes a "
                "fresh %s",
                path,
                kept,
                path.name,
            )


def _check_factories(registry: Mapping[str, object], name: str, what: str) -> None:
    """Refuse a registry entry that cannot be called (an env or protocol instance where a
    factory belongs): it would fail every episode with "object is not callable"."""
    for key, factory in registry.items():
        if not callable(factory):
            raise TypeError(
                f"RolloutEngine {name}[{key!r}] must be a factory that builds a fresh {what} per "
                f"episode, got a {type(factory).__name__} instance; register its class or a "
                f"function, e.g. {{{key!r}: {type(factory).__name__}}} or "
                f"{{{key!r}: lambda: {type(factory).__name__}(...)}}"
            )


def _check_built_env(env: object, name: str) -> None:
    """A TypeError naming the factory when it built something that is not a LudicEnv (closing
    such an object would otherwise raise outside the episode and abort the whole batch)."""
    if not isinstance(env, LudicEnv):
        raise TypeError(
            f"env factory {name!r} returned {type(env).__name__} {env!r:.60}, not a LudicEnv; "
            "return an instance of a LudicEnv subclass (e.g. a SingleAgentEnv), or wrap a "
            "Gymnasium env in ludic.envs.adapters.GymnasiumEnv"
        )


def warn_if_all_failed(rollouts: Sequence[Rollout], *, stage: str = "") -> bool:
    """Log an error (and return True) when every rollout of a non-empty batch failed, naming
    the first error: a batch that trains on nothing must not pass in silence."""
    if not rollouts or not all(r.failed for r in rollouts):
        return False
    first = rollouts[0].meta
    logger.error(
        "every one of the %d episodes in this batch failed%s; the first error (%s, %s): %s%s. "
        "Nothing from it can train or be evaluated: fix the cause (each rollout's "
        "meta['error'] holds its own) and run again",
        len(rollouts),
        stage,
        first.get("error_phase", "?"),
        first.get("error_type", "?"),
        first.get("error", "?"),
        TIMEOUT_ADVICE if first.get("error_phase") == "timeout" and len(rollouts) > 1 else "",
    )
    return True


TIMEOUT_ADVICE = (
    ". episode_timeout_s counts each episode from its start, and the episodes in flight at "
    "once share one model, so on a slow or loaded machine each lasts about as long as all of "
    "them: give the engine a larger episode_timeout_s (or None) or a smaller concurrency"
)
"""Why every episode of a concurrent batch can time out together, and the way out."""


def _batch_cancelled() -> bool:
    """True when the running task itself is being cancelled (not merely something it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


_TRACEBACK_FRAMES = 20


def _failed_rollout(error_type: str, message: str, phase: str, trace: str | None = None) -> Rollout:
    meta: dict[str, Any] = {"error": message, "error_type": error_type, "error_phase": phase}
    if trace is not None:
        meta["error_traceback"] = trace
    return Rollout(meta=meta)


def _log_first_traceback(request: RolloutRequest, rollouts: Sequence[Rollout]) -> bool:
    """Log the traceback of a failed episode (True), or return False when it has none."""
    for rollout in rollouts:
        trace = rollout.meta.get("error_traceback")
        if rollout.failed and trace:
            logger.warning(
                "traceback of episode %s (the batch's first failure with one; the others are "
                "in each failed rollout's meta['error_traceback']):\n%s",
                request.request_id,
                trace.rstrip(),
            )
            return True
    return False


async def _close_env(env: LudicEnv | None) -> str | None:
    """Close the env (bounded by its `close_timeout_s`; a no-op when the protocol closed it);
    the error message, or None. Never raises but for a cancellation of the batch."""
    if env is None:
        return None
    try:
        await close_env(env)
    except EnvCloseError as e:
        logger.warning("%s", e)
        return str(e)
    return None


def _stamp(
    rollout: Rollout, request: RolloutRequest, *, elapsed_s: float, close_error: str | None
) -> None:
    meta: dict[str, Any] = {**request.meta, **rollout.meta}
    meta.update(
        request_id=request.request_id,
        group_id=request.group_id,
        env_seed=request.env_seed,
        sampling_seed=request.sampling_seed,
        env_name=request.env.name,
        protocol_name=request.protocol.name,
        episode_seconds=elapsed_s,
    )
    if close_error is not None:
        meta["env_close_error"] = close_error
    rollout.meta = meta
