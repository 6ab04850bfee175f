"""OpenEnv environments as Ludic envs: an in-process `Environment` or a server behind an
`EnvClient` (`--env openenv:http://host:8000`, or `--env openenv:module:EnvironmentClass`).

OpenEnv is async-first, so this env is too: it awaits `reset_async` / `step_async` (in-process)
or the client's `reset` / `step` (WebSocket session). The model's reply becomes one field of
the action (`action_field`, default: the action's only text field); the observation the model
reads is the observation's text field (`observation_field`, default: its only text field, else
its JSON without `done` / `reward` / `metadata`). OpenEnv's `reward` and `done` are the
reward and termination. It deliberately does not start containers or servers: give it a
running server's URL (checked reachable when `openenv:URL` is resolved, before a model loads),
or the Environment itself.
"""

from __future__ import annotations

import importlib
import inspect
import json
import socket
import typing
from collections.abc import Awaitable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ludic.envs.adapters._common import require
from ludic.envs.arg_types import checked_arguments
from ludic.envs.registry import EnvSpec
from ludic.envs.single_agent import SingleAgentEnv
from ludic.errors import Refusal
from ludic.types import Info, StepOutcome

_RESULT_FIELDS = ("done", "reward", "metadata")
_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")
_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
REACH_TIMEOUT_S = 5.0


class OpenEnvUnreachableError(Refusal, ConnectionError):
    """`openenv:URL` names a server that does not accept a connection."""


def _openenv() -> Any:
    return require("openenv.core", extra="openenv", package="openenv-core")


class OpenEnvEnv(SingleAgentEnv):
    """One OpenEnv env, one seat. Pass `env=` (an `openenv` `Environment` instance, run in
    process) or `base_url=` (a running OpenEnv server, reached with `GenericEnvClient`; an
    `EnvClient` instance may be passed as `env=` too).

    For an in-process Environment the action type comes from its `step` annotation (or
    `action_type=`); for a client the action is a dict `{action_field: reply}`.
    `reset(seed)` passes the seed on. A client session is closed by `close()`.
    """

    @checked_arguments  # a wrong type (from --env-kwargs JSON) is refused naming the keyword
    def __init__(
        self,
        env: Any = None,
        *,
        base_url: str | None = None,
        action_field: str | None = None,
        action_type: type | None = None,
        observation_field: str | None = None,
        system_prompt: str | None = None,
    ) -> None:
        core = _openenv()
        if (env is None) == (base_url is None):
            raise ValueError("OpenEnvEnv needs exactly one of env= or base_url=")
        if base_url is not None:
            env = core.GenericEnvClient(base_url=base_url)
        self.env = env
        self.in_process = isinstance(env, core.env_server.interfaces.Environment)
        if not self.in_process and not isinstance(env, core.EnvClient):
            raise TypeError(
                f"env must be an openenv Environment or EnvClient, got {type(env).__name__}"
            )
        self.action_type = action_type or (_step_action_type(env) if self.in_process else None)
        self.action_field = action_field or _text_field(self.action_type, "action")
        self.observation_field = observation_field
        self.system_prompt = system_prompt
        self._closed = False
        self._connected = False

    async def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        if self.in_process:
            obs = await self.env.reset_async(seed=seed)
            return self._text(obs), {}
        self._connected = True
        result = await self.env.reset(seed=seed)
        return self._text(result.observation), {}

    async def env_step(self, action: str) -> StepOutcome:
        if self.in_process:
            obs = await self.env.step_async(self._action(action))
            payload = _as_dict(obs)
            reward, done = payload.get("reward"), bool(payload.get("done", False))
        else:
            result = await self.env.step({self.action_field: action})
            obs, reward, done = result.observation, result.reward, bool(result.done)
        return StepOutcome(
            obs=self._text(obs),
            reward=float(reward or 0.0),
            terminated=done,
            info=_jsonable(_as_dict(obs).get("metadata") or {}),
        )

    def close(self) -> Awaitable[None] | None:
        """Close the Environment, or the client's session; an awaitable only when there is a
        session to close (a client never reset never connected), so a caller that builds an
        env just to inspect it can close it synchronously."""
        if self._closed or (not self.in_process and not self._connected):
            self._closed = True
            return None
        self._closed = True
        result = self.env.close()
        return result if inspect.isawaitable(result) else None

    def _action(self, text: str) -> Any:
        if self.action_type is None:
            return {self.action_field: text}
        return self.action_type(**{self.action_field: text})

    def _text(self, obs: Any) -> str:
        payload = _as_dict(obs)
        if self.observation_field is not None:
            if self.observation_field not in payload:
                raise KeyError(
                    f"observation has no field {self.observation_field!r}; it has {sorted(payload)}"
                )
            return str(payload[self.observation_field])
        shown = {k: v for k, v in payload.items() if k not in _RESULT_FIELDS}
        texts = [v for v in shown.values() if isinstance(v, str)]
        if len(shown) == 1 and len(texts) == 1:
            return texts[0]
        return json.dumps(shown, default=str, sort_keys=True)


def _step_action_type(env: Any) -> type | None:
    hints = typing.get_type_hints(type(env).step)
    action = hints.get("action")
    return action if isinstance(action, type) and hasattr(action, "model_fields") else None


def _text_field(action_type: type | None, what: str) -> str:
    """The one `str` field of a pydantic action (besides metadata); needs `action_field=`
    when there is none or several."""
    if action_type is None:
        raise ValueError(
            f"cannot tell which {what} field holds the model's text; pass action_field="
        )
    fields = {
        name: f
        for name, f in getattr(action_type, "model_fields", {}).items()
        if name not in _RESULT_FIELDS and f.annotation is str
    }
    if len(fields) != 1:
        raise ValueError(
            f"{action_type.__name__} has {len(fields)} text fields ({sorted(fields)}); pass "
            "action_field= to say which one takes the model's reply"
        )
    return next(iter(fields))


def _as_dict(obs: Any) -> dict[str, Any]:
    if hasattr(obs, "model_dump"):
        return dict(obs.model_dump())
    if isinstance(obs, Mapping):
        return dict(obs)
    return {"observation": obs}


def _jsonable(value: Mapping[str, Any]) -> Info:
    return json.loads(json.dumps({str(k): v for k, v in value.items()}, default=str))


def env_spec(target: str) -> EnvSpec:
    """The registry entry for `openenv:URL` (a running server) or `openenv:module:Class` (an
    in-process Environment built with the env kwargs). The reply is the action text."""
    _openenv()
    if target.startswith(_URL_SCHEMES):
        check_reachable(target)

        def factory(**kwargs: Any) -> OpenEnvEnv:
            return OpenEnvEnv(base_url=target, **kwargs)

    else:
        module_name, sep, attr = target.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(
                f"openenv:{target} is neither a server URL (openenv:http://localhost:8000) nor "
                "an Environment class (openenv:my_package.server:MyEnvironment)"
            )
        env_class = _import_class(target, module_name, attr)
        adapter_keys = ("action_field", "action_type", "observation_field", "system_prompt")

        def factory(**kwargs: Any) -> OpenEnvEnv:
            own = {k: kwargs.pop(k) for k in adapter_keys if k in kwargs}
            return OpenEnvEnv(env_class(**kwargs), **own)

    return EnvSpec(
        name=f"openenv:{target}",
        factory=factory,
        parser=None,
        description=f"OpenEnv environment {target}",
    )


def check_reachable(url: str, *, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to `url`'s host and port, so a server that is down or
    a mistyped URL is refused in one line when the env is resolved, not by every episode's
    reset once a model has loaded and the run has started."""
    parts = urlsplit(url)
    try:
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError as e:  # a port that is not a number, or out of range
        raise ValueError(f"openenv:{url}: {e}; write openenv:http://HOST:PORT") from None
    if not parts.hostname:
        raise ValueError(f"openenv:{url} names no host; write openenv:http://HOST:PORT")
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise OpenEnvUnreachableError(
            f"openenv:{url}: cannot reach the OpenEnv server at {parts.hostname}:{port} "
            f"({reason}); start the server, or fix the URL"
        ) from None


def _import_class(target: str, module_name: str, attr: str) -> Any:
    """The Environment class `openenv:module:Class` names; a module that is not there or a
    name it lacks is refused naming both (an import error inside the module keeps its
    traceback: a bug of that package)."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + ".").startswith(e.name + "."):
            raise
        raise ValueError(
            f"openenv:{target}: cannot import module {module_name!r} ({e}); install the package "
            "that holds the Environment, or run from the folder that holds it (the working "
            "directory is importable)"
        ) from e
    if not hasattr(module, attr):
        raise ValueError(f"openenv:{target}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)
