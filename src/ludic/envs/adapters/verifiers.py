"""verifiers (prime-rl's environment library, >= 0.4) environments as Ludic envs.

`VerifiersEnv("my_taskset")` or `--env verifiers:my_taskset` loads an environment package the
way `vf-eval my_taskset` does (its taskset, its `Env` if it exports one, its `@reward`s) and
runs its episodes with verifiers' own machinery. verifiers owns the loop (its env drives an
agent harness that calls an OpenAI-compatible endpoint), so the adapter inverts it: every model
call verifiers makes reaches the Ludic agent as an observation, and the agent's reply goes back
to verifiers as the assistant message. The Ludic agent samples through its ChatClient, so each
call is recorded token-in / token-out (prompt ids, completion ids, behaviour logprobs, policy
version) as an `AgentStep`; the episode's reward is the trace's rubric reward (`trace.reward`),
scored by the package's own parsers. The suggested Ludic parser is therefore the identity: the
whole completion goes to verifiers unparsed.

Single-turn tasksets and multi-turn envs (an `Env` that talks to its agent through
`agents.agent.interaction(task)` turns) work unchanged; the Ludic agent's context is checked
against the conversation verifiers sends at every call, so a mismatch is an error, not a silent
off-policy sample. Deliberately not supported: multi-seat envs (user simulation, judges), tool
calling (a task with tool servers or a request carrying tools: Ludic's text agent cannot answer
with tool calls here), and runtimes other than the local subprocess one: the harness is an
in-process chat loop (the `null` harness's loop without tools) on the local runtime, replacing
the package's own harness, so no container, sandbox or uv program is started. The Ludic agent's
sampling settings apply (verifiers' own are ignored) and the reply's finish reason reaches
verifiers as "stop"; a verifiers limit that ends the trace (`max_turns`, token caps) is a
Ludic truncation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic.envs.adapters._common import require
from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.envs.registry import EnvSpec
from ludic.types import Info, StepOutcome

_MODEL = "ludic-policy"
"""The model name verifiers' requests carry; the Ludic agent's client decides what samples."""


def _vf() -> Any:
    require("verifiers", extra="verifiers")
    return require("verifiers.v1", extra="verifiers")


def _bridge() -> Any:
    _vf()
    return require("ludic.envs.adapters._verifiers_bridge", extra="verifiers", package="verifiers")


@dataclass(slots=True)
class _Call:
    """One model call verifiers is waiting on: the seat's new messages and the reply future."""

    seat: str
    session_id: str | None
    messages: list[Any]
    reply: asyncio.Future[str] = field(repr=False)


@dataclass(slots=True)
class _Done:
    """The episode ended: its verifiers `Episode`, or the exception that ended the run."""

    episode: Any = None
    error: BaseException | None = None


class VerifiersEnv(LudicEnv):
    """One verifiers episode per Ludic episode. `reset(seed)` runs task `seed % num_tasks` of
    the taskset (so a GRPO group shares one task); each model call verifiers makes is one
    Ludic step of the seat that made it, and the step that ends the episode carries the
    seat's trace reward and `info["vf_rewards"]` / `info["vf_metrics"]`.

    `taskset` is the package's taskset id (an importable module exporting its `Taskset`, as
    for `vf-eval`); `taskset_config` sets its config fields (`--env.taskset.*` in verifiers'
    CLI); `env_id` pins an `Env` package as `--env.id` does; `num_tasks` caps how many tasks
    are loaded (required for an infinite taskset). `max_turns` bounds each seat's model calls
    (verifiers' `--env.agent.max-turns`); `timeout_s` bounds the whole episode.
    """

    parser = None  # the completion goes to verifiers whole: its own parser reads it

    def __init__(
        self,
        taskset: str,
        *,
        taskset_config: Mapping[str, Any] | None = None,
        env_id: str = "",
        num_tasks: int | None = None,
        max_turns: int | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        vf = _vf()
        self.vf_env, seats = _build_env(
            vf, taskset, taskset_config or {}, env_id, max_turns, timeout_s
        )
        self.seats: tuple[str, ...] = tuple(seats)
        _refuse_tools(self.vf_env.taskset, taskset)
        self.tasks = _load_tasks(self.vf_env.taskset, taskset, num_tasks)
        self.timeout_s = timeout_s
        self.system_prompt: str | None = None
        self.task_index: int | None = None
        self._events: asyncio.Queue[_Call | _Done] = asyncio.Queue()
        self._pending: dict[str, _Call] = {}
        self._transcripts: dict[str, list[tuple[str, str]]] = {}  # per seat: (role, text)
        self._seat_sessions: dict[str, str | None] = {}
        self._runner: asyncio.Task[None] | None = None
        self._trace_seats: dict[str, str] = {}

    @property
    def agent_ids(self) -> Sequence[str]:
        return self.seats

    @property
    def active_agents(self) -> Sequence[str]:
        return list(self._pending)

    async def reset(self, seed: int | None = None) -> ResetResult:
        await self._stop_runner()
        self.task_index = (seed or 0) % len(self.tasks)
        self._events = asyncio.Queue()
        self._pending, self._transcripts, self._seat_sessions, self._trace_seats = {}, {}, {}, {}
        self.system_prompt = None
        self._runner = asyncio.create_task(self._run_episode(self.tasks[self.task_index]))
        event = await self._next_event()
        if isinstance(event, _Done):
            raise RuntimeError(_no_call_message(event, self.vf_env))
        return {event.seat: (self._observation(event, first=True), self._info())}

    async def step(self, actions: Mapping[str, str]) -> StepResult:
        for seat, action in actions.items():
            call = self._pending.pop(seat, None)
            if call is None:
                raise ValueError(
                    f"seat {seat!r} has no model call waiting; active: {self.active_agents}"
                )
            self._transcripts[seat].append(("assistant", action))
            call.reply.set_result(action)
        event = await self._next_event()
        if isinstance(event, _Done):
            return self._final_outcomes(event)
        obs = self._observation(event)
        return {event.seat: StepOutcome(obs=obs, reward=0.0, info=self._info())}

    def close(self) -> Awaitable[None] | None:
        if self._runner is None and not self._pending:
            return None  # nothing started: a synchronous close (the CLI's seat check) is done
        return self._stop_runner()

    # --- the episode, run by verifiers in a background task ---------------------------------

    async def _run_episode(self, task: Any) -> None:
        vf, bridge = _vf(), _bridge()
        try:
            async with self.vf_env.serving():
                bridge.install_client(self.vf_env, bridge.LudicBridgeClient(self.model_call))
                ctx = vf.ModelContext(model=_MODEL, client=bridge.client_config())
                slot = self.vf_env.slots(task, 1)[0]
                episode = await self.vf_env.run_slot(slot, ctx, on_trace=self._on_trace)
            self._events.put_nowait(_Done(episode=episode))
        except Exception as e:  # handed to the Ludic side: it fails the episode
            self._events.put_nowait(_Done(error=e))

    def _on_trace(self, trace: Any) -> None:
        name = getattr(trace.agent, "name", None) if trace.agent is not None else None
        self._trace_seats[trace.id] = name or self.seats[0]

    async def model_call(self, session_id: str | None, messages: list[Any]) -> str:
        """Called by the bridge client for each verifiers model call: queue it for the Ludic
        agent of its seat and wait for the reply text."""
        seat = self._trace_seats.get(session_id or "", self.seats[0])
        if seat in self._pending:
            raise RuntimeError(
                f"seat {seat!r} made a second model call before the first was answered"
            )
        call = _Call(seat, session_id, messages, asyncio.get_running_loop().create_future())
        self._pending[seat] = call
        self._events.put_nowait(call)
        return await call.reply

    async def _next_event(self) -> _Call | _Done:
        try:
            return await asyncio.wait_for(self._events.get(), timeout=self.timeout_s)
        except TimeoutError as e:
            raise TimeoutError(
                f"the verifiers episode made no model call and did not end within "
                f"{self.timeout_s:g}s (VerifiersEnv(timeout_s=...))"
            ) from e

    async def _stop_runner(self) -> None:
        for call in self._pending.values():
            call.reply.cancel()
        self._pending = {}
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
        self._runner = None

    # --- verifiers messages and results as Ludic observations and outcomes ------------------

    def _observation(self, call: _Call, *, first: bool = False) -> str:
        """The text of the messages verifiers added since this seat's last reply, after
        checking that the rest is the conversation the seat's Ludic agent already holds."""
        seat = call.seat
        if self._seat_sessions.setdefault(seat, call.session_id) != call.session_id:
            raise RuntimeError(
                f"seat {seat!r} started a second conversation in one verifiers episode; "
                "VerifiersEnv maps each seat to one conversation (one Ludic agent context)"
            )
        transcript = self._transcripts.setdefault(seat, [])
        sent = [(m.role, _text(m.content)) for m in call.messages]
        if sent[: len(transcript)] != transcript:
            raise RuntimeError(
                f"verifiers rewrote seat {seat!r}'s earlier messages (a request hook or "
                "compaction); the Ludic agent's context no longer matches what verifiers sends"
            )
        texts: list[str] = []
        for role, text in sent[len(transcript) :]:
            if role == "system" and first and not transcript:
                self.system_prompt = text  # read by the protocol right after reset
            elif role == "user":
                texts.append(text)
            else:
                raise ValueError(
                    f"verifiers sent a {role!r} message to seat {seat!r}; VerifiersEnv passes "
                    "only system and user messages to the Ludic agent (no tool calling)"
                )
            transcript.append((role, text))
        return "\n\n".join(texts)

    def _info(self) -> Info:
        return {"vf_task_index": self.task_index}

    def _final_outcomes(self, done: _Done) -> StepResult:
        if done.error is not None:
            raise RuntimeError(f"the verifiers episode failed: {done.error!r}") from done.error
        episode = done.episode
        if episode.errors:
            raise RuntimeError(f"the verifiers episode failed: {_errors(episode.errors)}")
        outcomes: StepResult = {}
        for trace in episode.traces:
            seat = self._trace_seats.get(trace.id, self.seats[0])
            if not trace.ok:
                raise RuntimeError(
                    f"the verifiers trace of seat {seat!r} failed: {_errors(trace.errors)}"
                )
            info: Info = {
                **self._info(),
                "vf_rewards": {
                    k: (None if r is None else r.value) for k, r in trace.rewards.items()
                },
                "vf_metrics": dict(trace.metrics),
                "vf_stop_condition": trace.stop_condition,
                "vf_num_turns": trace.num_turns,
            }
            truncated = bool(trace.is_truncated)  # a verifiers limit (max_turns, tokens) hit
            outcomes[seat] = StepOutcome(
                obs="",
                reward=float(trace.reward),
                terminated=not truncated,
                truncated=truncated,
                info=info,
            )
        return outcomes


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        getattr(part, "text", "") for part in content or [] if getattr(part, "text", None)
    )


def _errors(errors: Sequence[Any]) -> str:
    return "; ".join(f"{e.type}: {e.message}" for e in errors) or "no error recorded"


def _no_call_message(done: _Done, vf_env: Any) -> str:
    if done.error is not None:
        return f"the verifiers episode failed before any model call: {done.error!r}"
    errors = [e for t in done.episode.traces for e in t.errors] + list(done.episode.errors)
    return f"the verifiers episode of {type(vf_env).__name__} ended without a model call" + (
        f": {_errors(errors)}" if errors else ""
    )


# --- building the verifiers env --------------------------------------------------------------


def _build_env(
    vf: Any,
    taskset: str,
    taskset_config: Mapping[str, Any],
    env_id: str,
    max_turns: int | None,
    timeout_s: float,
) -> tuple[Any, list[str]]:
    """The package's `Env` and its seats, every seat on the local subprocess runtime and the
    in-process chat harness, with a loopback interception server (the endpoint the harness
    calls) and one seat acting at a time."""
    bridge = _bridge()
    bridge.register_harness()
    cls = vf.environment_class(taskset, env_id)
    seats = vf.env_config_type(taskset, env_id)
    raw: dict[str, Any] = {"taskset": {**taskset_config, "id": taskset}, "id": env_id}
    raw["interception"] = {"type": "server"}
    raw["timeout"] = {"episode": timeout_s}
    names = _seat_names(vf, seats)
    if len(names) != 1:
        raise ValueError(
            f"verifiers env {cls.__name__} has seats {names}; VerifiersEnv runs single-seat envs "
            "(one policy conversation per episode), not multi-agent ones such as user simulation"
        )
    for name in names:
        default = seats.model_fields[name].default  # the env's own seat settings (max_turns...)
        agent: dict[str, Any] = {
            **(default.model_dump(exclude_unset=True) if default is not None else {}),
            "harness": {"id": bridge.HARNESS_ID},
            "runtime": {"type": "subprocess"},
            "model": None,  # a seat pinned to its own model or endpoint is played by Ludic too
            "client": None,
        }
        if max_turns is not None:
            agent["max_turns"] = max_turns
        raw[name] = agent
    return cls(vf.resolve_env_config(raw)), names


def _seat_names(vf: Any, config_type: Any) -> list[str]:
    return [
        name
        for name, info in config_type.model_fields.items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, vf.AgentConfig)
    ]


def _refuse_tools(taskset: Any, name: str) -> None:
    config = taskset.config
    servers = [*type(taskset).task_type().toolsets(config.task), *taskset.toolsets(config)]
    if servers:
        names = sorted(type(server).__name__ for server in servers)
        raise ValueError(
            f"verifiers taskset {name!r} gives its tasks tool servers {names}; VerifiersEnv "
            "does not support tool calling (the Ludic agent answers in text only)"
        )


_TASKS: dict[tuple[str, str, int | None], list[Any]] = {}
"""Loaded tasks by (taskset class, config JSON, num_tasks): the CLI builds one env per
episode, and a taskset's `load()` may read a whole dataset."""


def _load_tasks(taskset: Any, name: str, num_tasks: int | None) -> list[Any]:
    cls = type(taskset)
    key = (f"{cls.__module__}.{cls.__qualname__}", taskset.config.model_dump_json(), num_tasks)
    if key not in _TASKS:
        _TASKS[key] = _read_tasks(taskset, name, num_tasks)
    return _TASKS[key]


def _read_tasks(taskset: Any, name: str, num_tasks: int | None) -> list[Any]:
    if num_tasks is not None:
        taskset = taskset.take(num_tasks)
    elif not taskset.bounded:
        raise ValueError(f"verifiers taskset {name!r} is infinite; pass num_tasks=N")
    tasks = list(taskset)
    if not tasks:
        raise ValueError(f"verifiers taskset {name!r} yielded no tasks")
    return tasks


def env_spec(taskset: str) -> EnvSpec:
    """The registry entry for `verifiers:TASKSET` (no parser: verifiers parses the reply)."""
    vf = _vf()
    try:
        vf.taskset_config_type(taskset)  # a missing or malformed package fails here
    except ModuleNotFoundError as e:
        if not _is_the_taskset(e.__cause__, taskset):
            raise  # the package exists but one of its own imports is missing: its traceback
        raise ValueError(
            f"{e} Install the environment package into this Python (pip install it), or run "
            "from the folder that holds it (the working directory is importable)"
        ) from e
    return EnvSpec(
        name=f"verifiers:{taskset}",
        factory=lambda **kwargs: VerifiersEnv(taskset, **kwargs),
        parser=None,
        description=f"verifiers environment {taskset}",
    )


def _is_the_taskset(cause: BaseException | None, taskset: str) -> bool:
    """Whether verifiers' "not found" came from the taskset module itself being absent (its
    loader imports `owner/name@version` as `name`, dashes as underscores)."""
    module = taskset.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    return isinstance(cause, ModuleNotFoundError) and cause.name == module
