"""The environment kernel: multi-agent by default, sync or async.

An env is a state transition function with an optional reward. It never sees prompts, tool
calls or parsing: agents and protocols handle those. It does not run the interaction loop.
`closing_env` / `close_env` are how protocols and the engine close one, bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import numbers
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from ludic._aio import call_off_loop, maybe_await
from ludic._log_once import warn_once
from ludic.types import Info, StepOutcome

logger = logging.getLogger(__name__)
T = TypeVar("T")

ResetResult = dict[str, tuple[str, Info]]
StepResult = dict[str, StepOutcome]


def set_parse_failure_ends_episode(env: object, value: bool | None) -> None:
    """Set `env.parse_failure_ends_episode` from a constructor argument: None keeps the class's
    value (so a subclass may set it as a class attribute); anything but a bool is refused (a
    JSON string from --env-kwargs, say)."""
    if value is None:
        return
    if not isinstance(value, bool):
        raise TypeError(f"parse_failure_ends_episode must be true or false, got {value!r}")
    env.parse_failure_ends_episode = value  # type: ignore[attr-defined]


class LudicEnv(ABC):
    """Base for all environments.

    - `agent_ids`: every seat in the game.
    - `reset(seed)` -> `{agent_id: (observation, info)}` for every agent.
    - `active_agents`: the agents expected to act on the next `step`.
    - `step(actions)` -> `{agent_id: StepOutcome}`; `actions` holds one action per active agent.
      Include an outcome for every agent the step concerns (an opponent's move changes your
      board and may end your game), not only those who acted. An outcome both `terminated`
      and `truncated` is recorded as terminated (Gymnasium's reading: a terminal state).
    - `state_key(agent_id)`: an optional hashable identity of the agent's current state
      (str, int, or tuple of those); GiGPO groups steps that share it. None: no key.
    - `system_prompt`: an optional suggested system prompt for agents.
    - `current_observation(agent_id)`: optional; the current observation again (shown after a
      reply that failed to parse). None: not offered.
    - `parse_failure_ends_episode`: whether a reply that fails to parse ends the episode
      (one-answer envs) or is retried.

    `reset`, `step` and `close` may be `async def` in subclasses. Protocols run a synchronous
    `reset` / `step` / `close` on a worker thread, so a blocking one neither stalls the other
    episodes nor escapes the episode timeout (it must then be safe to call from a thread other
    than the one that built the env; calls never overlap). An env whose synchronous methods
    are pure and fast (a board game) sets `inline_sync_calls = True`: they then run on the
    event loop and skip the thread hop, which costs far more than such a step when the loop is
    busy (see bench/rollout_overhead.py). `state_key` always runs on the event loop: keep it
    cheap. An async method must not block: it runs on the event loop.
    `close_timeout_s` bounds `close`; one that takes longer fails the episode.
    `slow_call_warning_s`: a `reset` or `step` still running this long is logged once.
    """

    system_prompt: str | None = None
    """A suggested system prompt (the rules, the action format). The agent uses it unless it
    has its own (`Agent(system_prompt=...)` wins); None: no system message."""
    close_timeout_s: float = 10.0
    slow_call_warning_s: float | None = 60.0
    """A `reset` or `step` still running after this many seconds is logged once per env class
    and method (a `close` is watched too, but `close_timeout_s` fails it first by default), naming the env, the call and the seconds: a hung env is otherwise
    silent until the episode timeout (`--episode-timeout-s`, 600 s by default) fails it. None:
    no warning. (A synchronous call made inline on the event loop, `inline_sync_calls`, is not
    watched: it holds the loop, so nothing can run beside it.)"""
    inline_sync_calls: bool = False
    parse_failure_ends_episode: bool = False
    """True for an env that takes one reply per episode (one question, one answer): a reply
    that fails to parse is that agent's answer, so every protocol ends the episode there
    (`termination_reason` "parse_error", the parser's penalty as its reward) instead of
    asking again. False (the default): the agent sees the parser's feedback and replies
    again, up to the protocol's `max_steps`."""

    @property
    @abstractmethod
    def agent_ids(self) -> Sequence[str]: ...

    @property
    @abstractmethod
    def active_agents(self) -> Sequence[str]: ...

    @abstractmethod
    def reset(self, seed: int | None = None) -> ResetResult | Awaitable[ResetResult]: ...

    @abstractmethod
    def step(self, actions: Mapping[str, str]) -> StepResult | Awaitable[StepResult]: ...

    def state_key(self, agent_id: str) -> Hashable | None:
        """The hashable identity of `agent_id`'s CURRENT state (str, int or a tuple of those),
        or None for no key. Protocols read it after `reset` and after every `step`: the
        agent step records the key of the state it acted from (GiGPO's anchor state), the
        `EnvironmentStep` the key of the state the step led to. Equal keys must mean the same
        decision; without a key GiGPO groups by a hash of the observation text. A key that is
        not an exact identity (a list, an array, an object) fails the episode with a TypeError
        (see `state_key_to_str`)."""
        return None

    def current_observation(self, agent_id: str) -> str | None:
        """`agent_id`'s observation of the CURRENT state, rendered again, or None (the default)
        when the env does not offer it. After a reply that fails to parse (the state does not
        change), protocols show it below the parser's feedback, so the agent sees again what
        it must act on instead of the feedback alone; anything but a str or None fails the
        episode naming this method (`read_current_observation`). It runs on the event loop:
        keep it cheap."""
        return None

    def close(self) -> Awaitable[None] | None:  # noqa: B027 - optional hook
        """Release resources (sockets, subprocesses). Protocols and the RolloutEngine both
        call it, so it may run more than once: make it idempotent."""


async def call_env(
    env: LudicEnv, fn: Callable[..., T | Awaitable[T]], /, *args: Any, **kwargs: Any
) -> T:
    """Call one of `env`'s methods (sync or async): a synchronous one on a worker thread, or on
    the event loop when `env.inline_sync_calls` is set. How protocols reset, step and close."""
    if env.inline_sync_calls:
        return await _warned_if_slow(env, fn, maybe_await(fn(*args, **kwargs)))
    return await _warned_if_slow(env, fn, call_off_loop(fn, *args, **kwargs))


async def _warned_if_slow(env: LudicEnv, fn: Callable[..., object], call: Awaitable[T]) -> T:
    """Await `call`; log once if it is still running after `env.slow_call_warning_s`."""
    after_s = env.slow_call_warning_s
    if after_s is None:
        return await call
    loop = asyncio.get_running_loop()
    method = getattr(fn, "__name__", "call")
    if callable(getattr(type(env), f"env_{method}", None)):  # SingleAgentEnv: the user's method
        method = f"env_{method}"
    timer = loop.call_later(after_s, _warn_slow_call, type(env).__name__, method, after_s)
    try:
        return await call
    finally:
        timer.cancel()


def _warn_slow_call(env_name: str, method: str, after_s: float) -> None:
    warn_once(
        logger,
        ("slow_env_call", env_name, method),
        "%s.%s has not returned after %g s (it may hang): the episode fails only when its "
        "timeout runs out (--episode-timeout-s, 600 s by default). Fix the env, lower "
        "--episode-timeout-s, or raise %s.slow_call_warning_s if it is only slow (logged once)",
        env_name,
        method,
        after_s,
        env_name,
    )


class EnvCloseError(RuntimeError):
    """`env.close()` raised or did not finish within `env.close_timeout_s`."""


async def close_env(env: LudicEnv) -> None:
    """Close `env` (sync or async `close`), bounded by `env.close_timeout_s`; a no-op when it
    was already closed (or tried) since `closing_env` began the episode, so a protocol and the
    engine never wait twice on one hung `close`.

    Raises EnvCloseError naming the env and the cause; a cancellation of the caller propagates.
    """
    if getattr(env, _CLOSE_ATTEMPTED, False):
        return
    _mark_closed(env, True)
    if type(env).close is LudicEnv.close:
        return  # the base no-op: not worth a thread hop
    timeout_s = env.close_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            await call_env(env, env.close)
    except TimeoutError as e:
        raise EnvCloseError(
            f"{type(env).__name__}.close() did not finish within close_timeout_s={timeout_s}; "
            "make close() return promptly (or raise close_timeout_s on the env class)"
        ) from e
    except Exception as e:
        raise EnvCloseError(f"{type(env).__name__}.close() raised {type(e).__name__}: {e}") from e


@contextlib.asynccontextmanager
async def closing_env(env: LudicEnv) -> AsyncIterator[LudicEnv]:
    """Run one episode of `env` in the block, then close it. A close failure after a clean
    block raises EnvCloseError; after a block that raised, it is logged and the block's error
    propagates (the first cause is the one to report)."""
    _mark_closed(env, False)  # an env reused for another episode is closed again after it
    try:
        yield env
    except BaseException:
        try:
            await close_env(env)
        except EnvCloseError as e:
            logger.warning("%s (while handling an earlier error)", e)
        raise
    await close_env(env)


_CLOSE_ATTEMPTED = "_ludic_close_attempted"


def _mark_closed(env: LudicEnv, value: bool) -> None:
    # Under __slots__ without room for the mark, close simply runs every time (idempotent).
    with contextlib.suppress(AttributeError):
        setattr(env, _CLOSE_ATTEMPTED, value)


def state_key_to_str(key: Hashable | None, *, where: str = "state_key") -> str | None:
    """Canonical JSON-safe form of a state key: a str stays as it is, None is no key, and an
    int, float, bool, bytes or a (nested) tuple of those becomes its repr (numpy scalars count
    as the Python number they hold). Anything else is refused with a TypeError naming `where`:
    its text is not an exact identity, so two different states could share a key (a list, or a
    numpy array whose repr elides its middle) or one state get a new key each time (an object
    whose repr holds its address, a set whose order varies between processes)."""
    if key is None or isinstance(key, str):
        return key
    return repr(_exact_key(key, where=where))


def read_state_key(env: LudicEnv, agent_id: str) -> str | None:
    """`env.state_key(agent_id)` in its canonical form (`state_key_to_str`), a bad key refused
    naming the env's method. How protocols read state keys."""
    where = f"{type(env).__name__}.{_written_method(env, 'env_state_key', 'state_key')}"
    return state_key_to_str(env.state_key(agent_id), where=where)


def read_current_observation(env: LudicEnv, agent_id: str) -> str | None:
    """`env.current_observation(agent_id)`, or a TypeError naming the env's method when it is
    neither a str nor None: the protocol appends it to the parser's feedback as text, so an
    array or a dict reached the model as its repr, in silence. How protocols read it."""
    observation = env.current_observation(agent_id)
    if observation is None or isinstance(observation, str):
        return observation
    method = _written_method(env, "env_current_observation", "current_observation")
    raise TypeError(
        f"{type(env).__name__}.{method} returned {type(observation).__name__} "
        f"{' '.join(repr(observation).split()):.60}; it is the text the model reads below the parser's feedback: "
        "return a str (render the state as the observation does), or None for none"
    )


def _written_method(env: LudicEnv, hook: str, method: str) -> str:
    """Which of `hook` (what SingleAgentEnv's `method` calls) and `method` the env's own class
    wrote: the first class in its MRO defining either (a subclass of SingleAgentEnv may
    override `method` itself, and `hasattr(env, hook)` is true for every one)."""
    for cls in type(env).__mro__:
        if hook in vars(cls):
            return hook
        if method in vars(cls):
            return method
    return method


def _exact_key(key: object, *, where: str) -> object:
    if isinstance(key, tuple):
        return tuple(_exact_key(part, where=where) for part in key)
    if type(key) in (str, bytes, bool, int, float) or key is None:
        return key
    # subclasses (np.float64, np.str_, np.bytes_) as their plain value: their repr differs
    # (np.float64(1.5)), which would give one state two keys
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bytes):
        return bytes(key)
    if type(key).__name__ in ("bool_", "bool"):  # numpy 1, 2
        return bool(key)  # type: ignore[arg-type]
    if isinstance(key, numbers.Integral):
        return int(key)
    if isinstance(key, numbers.Real):
        return float(key)
    raise TypeError(
        f"{where} returned {type(key).__name__} {key!r:.60}; a state key must be an exact "
        "identity of the state: a str, an int or a tuple of those (e.g. tuple(board), or "
        "tuple(sorted(items)) for a set; an array as tuple(arr.tolist())), or None for no key"
    )
