"""Gymnasium envs as Ludic envs: `GymnasiumEnv("FrozenLake-v1")`, or `--env gymnasium:ID`.

The observation the model reads is the env's text: a `Text` observation as it is, else the
ANSI rendering (colour highlights kept as `[x]`), else `str(obs)`; each one ends with the list
of legal actions. A `Discrete` action is named (FrozenLake's Left/Down/Right/Up, or `0..n-1`)
and the model replies `<action>NAME</action>`; `discrete_action_parser` checks the name.
The state key (for GiGPO) is the raw observation when it is hashable (an int, a tuple, a small
integer array). It deliberately does not handle continuous (Box) actions or image observations:
those are not text environments.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from ludic.envs.adapters._common import ansi_to_text, require
from ludic.envs.arg_types import checked_arguments, kwarg_refusal, mismatches
from ludic.envs.registry import EnvSpec
from ludic.envs.single_agent import SingleAgentEnv
from ludic.parsers import DEFAULT_PENALTY, Parser, xml_tag_parser
from ludic.types import Info, ParseResult, StepOutcome

# Action names of Gymnasium's toy-text envs (their docs), keyed by the entry point's class.
KNOWN_ACTION_NAMES: dict[str, tuple[str, ...]] = {
    "FrozenLakeEnv": ("Left", "Down", "Right", "Up"),
    "CliffWalkingEnv": ("Up", "Right", "Down", "Left"),
    "TaxiEnv": ("South", "North", "East", "West", "Pickup", "Dropoff"),
    "BlackjackEnv": ("Stick", "Hit"),
}
_MAX_KEY_SIZE = 256  # integer arrays up to this size become tuple state keys

SYSTEM_PROMPT = (
    "You are playing the Gymnasium environment {env_id}. Each turn you see the current state "
    "and the legal actions. Reply with exactly one action as <action>NAME</action>."
)


def _gym() -> Any:
    return require("gymnasium", extra="gymnasium")


class GymnasiumEnv(SingleAgentEnv):
    """One Gymnasium env, one seat. Build it from an id (`**make_kwargs` go to `gymnasium.make`,
    e.g. `map_name="8x8"`, `is_slippery=False`) or wrap a ready `env=` instance.

    `reset(seed)` passes the seed to Gymnasium, so a GRPO group (one seed) starts from one state.
    The reward, `terminated` and `truncated` (the TimeLimit wrapper's) are Gymnasium's own. An
    action that is not a legal name or index is not sent to the env: the step returns
    `invalid_action_reward` and the legal actions, and the episode goes on.
    """

    @checked_arguments  # its own keywords; the env's are checked against its constructor
    def __init__(
        self,
        env_id: str | None = None,
        *,
        env: Any = None,
        action_names: Sequence[str] | None = None,
        invalid_action_reward: float = DEFAULT_PENALTY,
        state_key_fn: Callable[[Any], Hashable | None] | None = None,
        **make_kwargs: Any,
    ) -> None:
        if (env_id is None) == (env is None):
            raise ValueError(
                "GymnasiumEnv needs exactly one of env_id (e.g. 'FrozenLake-v1') or env="
            )
        self.env = env if env is not None else make_gym_env(str(env_id), **make_kwargs)
        self.env_id = env_id or _registered_id(self.env) or type(self.env.unwrapped).__name__
        self.action_names = _action_names(self.env, action_names)
        self.invalid_action_reward = invalid_action_reward
        self.state_key_fn = state_key_fn or observation_state_key
        self.system_prompt = SYSTEM_PROMPT.format(env_id=self.env_id)
        self._obs: Any = None
        self._closed = False

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        obs, info = self.env.reset(seed=seed)
        self._obs = obs
        return self._observation_text(obs), _plain_info(info)

    def env_step(self, action: str) -> StepOutcome:
        gym_action = self._to_gym_action(action)
        if gym_action is None:
            return StepOutcome(
                obs=f"{action!r} is not a legal action. {self._actions_line()}",
                reward=self.invalid_action_reward,
                info={"invalid_action": True},
            )
        obs, reward, terminated, truncated, info = self.env.step(gym_action)
        self._obs = obs
        return StepOutcome(
            obs=self._observation_text(obs, over=bool(terminated or truncated)),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated) and not terminated,
            info={**_plain_info(info), "gym_action": _plain(gym_action)},
        )

    def env_state_key(self) -> Hashable | None:
        return None if self._obs is None else self.state_key_fn(self._obs)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.env.close()

    @property
    def parser(self) -> Parser:
        """`discrete_action_parser` over the action names, or `<action>` text for other spaces."""
        if self.action_names is None:
            return xml_tag_parser("action")
        return discrete_action_parser(self.action_names)

    def _to_gym_action(self, action: str) -> Any:
        if self.action_names is None:
            return action  # a Text action space takes the text itself
        index = action_index(action, self.action_names)
        if index is None:
            return None
        return int(getattr(self.env.action_space, "start", 0)) + index

    def _observation_text(self, obs: Any, *, over: bool = False) -> str:
        gym = _gym()
        if isinstance(self.env.observation_space, gym.spaces.Text):
            text = str(obs)
        elif self.env.render_mode == "ansi":
            text = ansi_to_text(str(self.env.render())).strip("\n")
        else:
            text = str(_plain(obs))
        return f"{text}\nThe episode is over." if over else f"{text}\n{self._actions_line()}"

    def _actions_line(self) -> str:
        if self.action_names is None:
            return "Reply with your action as <action>TEXT</action>."
        return f"Legal actions: {', '.join(self.action_names)}. Reply with <action>NAME</action>."


def make_gym_env(env_id: str, **make_kwargs: Any) -> Any:
    """`gymnasium.make(env_id, **make_kwargs)`, with `render_mode="ansi"` when the env offers
    it and none was asked for; a clear error for an unknown id."""
    gym = _gym()
    try:
        spec = gym.spec(env_id)
    except Exception as e:  # gymnasium raises its own NameNotFound/VersionNotFound errors
        raise ValueError(f"unknown Gymnasium env {env_id!r}: {e}") from e
    creator = gym.envs.registration.load_env_creator(spec.entry_point)
    given = sorted(make_kwargs)
    offers_ansi = "ansi" in getattr(creator, "metadata", {}).get("render_modes", ())
    _check_kwarg_types(env_id, creator, make_kwargs)
    if "render_mode" not in make_kwargs and offers_ansi:
        make_kwargs["render_mode"] = "ansi"
    try:
        return gym.make(env_id, **make_kwargs)
    except TypeError as e:  # a keyword the env's constructor does not take (--env-kwargs)
        if not given or "keyword argument" not in str(e):
            raise  # another TypeError inside the env: not the user's keywords
        raise ValueError(
            f"Gymnasium env {env_id!r} did not take the keywords {given} (--env-kwargs): {e}; "
            f"it takes {_parameters(creator)}"
        ) from e


def _check_kwarg_types(env_id: str, creator: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword whose value the env's constructor annotation refuses (`"no"` for
    FrozenLake's `is_slippery: bool`, which Gymnasium would take as true), naming the env, the
    keyword, the value and the fix, as `--env-kwargs` is checked for Ludic's own envs."""
    for name, annotation in mismatches(creator, kwargs):
        raise ValueError(kwarg_refusal(f"Gymnasium env {env_id!r}", name, kwargs[name], annotation))


def _parameters(creator: Any) -> str:
    """The keyword parameters of a Gymnasium env class or creator function, for an error."""
    try:
        names = [n for n in inspect.signature(creator).parameters if n not in ("self", "kwargs")]
    except (TypeError, ValueError):
        return "keywords its documentation lists"
    return ", ".join(names) if names else "no keywords"


def action_index(action: str, names: Sequence[str]) -> int | None:
    """The index of `action` among `names` (case-insensitive), or of a bare index; else None."""
    text = action.strip().casefold()
    for i, name in enumerate(names):
        if text == name.casefold():
            return i
    if text.isdigit() and int(text) < len(names):
        return int(text)
    return None


def discrete_action_parser(names: Sequence[str], *, penalty: float = DEFAULT_PENALTY) -> Parser:
    """`<action>NAME</action>` where NAME is one of `names` (or its index); the action passed on
    is the canonical name. Anything else fails with `penalty` and lists the legal actions."""
    tag = xml_tag_parser("action", penalty=penalty)
    legal = ", ".join(names)

    def parse(text: str) -> ParseResult:
        result = tag(text)
        if result.action is None:
            return ParseResult(
                action=None, reward=result.reward, obs=f"{result.obs} Legal: {legal}."
            )
        index = action_index(result.action, names)
        if index is None:
            return ParseResult(
                action=None,
                reward=penalty,
                obs=f"{result.action!r} is not a legal action; choose one of {legal}.",
            )
        return ParseResult(action=names[index], reward=result.reward)

    return parse


def observation_state_key(obs: Any) -> Hashable | None:
    """The observation itself as a state key when it is small and exact: an int, a string, a
    tuple of those, or an integer array of at most 256 entries (as a tuple); else None."""
    value = _plain(obs)
    if isinstance(value, list):
        if len(value) > _MAX_KEY_SIZE or not all(isinstance(v, int) for v in _flat(value)):
            return None
        return _as_tuple(value)
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    if isinstance(value, tuple) and all(isinstance(v, (int, str)) for v in value):
        return value
    return None


def env_spec(env_id: str) -> EnvSpec:
    """The registry entry for `gymnasium:ENV_ID`: the factory and the env's action parser."""
    probe = GymnasiumEnv(env_id)
    try:
        parser = probe.parser
    finally:
        probe.close()
    return EnvSpec(
        name=f"gymnasium:{env_id}",
        factory=lambda **kwargs: GymnasiumEnv(env_id, **kwargs),
        parser=parser,
        description=f"Gymnasium env {env_id}",
    )


def _action_names(env: Any, given: Sequence[str] | None) -> tuple[str, ...] | None:
    gym = _gym()
    space = env.action_space
    if isinstance(space, gym.spaces.Text):
        return None
    if not isinstance(space, gym.spaces.Discrete):
        raise ValueError(
            f"GymnasiumEnv supports Discrete and Text action spaces, got {space}; wrap the env "
            "so that its actions are discrete or text"
        )
    n = int(space.n)
    if given is not None:
        return _checked_action_names(given, n)
    unwrapped = env.unwrapped
    known = KNOWN_ACTION_NAMES.get(type(unwrapped).__name__)
    if known is not None and len(known) == n:
        return known
    meanings = getattr(unwrapped, "get_action_meanings", None)  # Atari-style envs
    if callable(meanings):
        return tuple(str(m) for m in meanings())
    return tuple(str(i) for i in range(n))


def _registered_id(env: Any) -> str | None:
    """The id Gymnasium registered `env` under, or None for an env built by hand (its class
    name then names it in the system prompt, not the word "env")."""
    return getattr(getattr(env, "spec", None), "id", None)


def _checked_action_names(given: object, n: int) -> tuple[str, ...]:
    """`action_names` as a tuple of `n` distinct names, or a ValueError / TypeError that says
    what to pass: a str is refused (it would be split into its characters), and so are names
    that are not strings or that match one another (the reply is matched case-insensitively,
    so a duplicate could never be chosen)."""
    example = "action_names=['Left', 'Down', 'Right', 'Up']"
    if isinstance(given, str) or not isinstance(given, Sequence):
        raise TypeError(
            f"GymnasiumEnv action_names must be a list of names, one per action, got "
            f"{type(given).__name__} {given!r:.60}; pass e.g. {example} (in --env-kwargs, "
            'a JSON list: {"action_names": ["Left", "Down", "Right", "Up"]})'
        )
    strays = [name for name in given if not isinstance(name, str) or not name.strip()]
    if strays:
        raise TypeError(
            f"GymnasiumEnv action_names must be non-empty strings, got {strays[0]!r}; pass "
            f"e.g. {example}"
        )
    if len(given) != n:
        raise ValueError(f"action_names has {len(given)} names for {n} actions")
    folded = [name.casefold() for name in given]
    repeated = sorted({name for name in given if folded.count(name.casefold()) > 1})
    if repeated:
        raise ValueError(
            f"GymnasiumEnv action_names repeats {repeated} (a reply is matched ignoring case, "
            "so the model could never choose the second); give each action its own name"
        )
    return tuple(given)


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python ints, floats and lists (JSON-safe, hashable-able)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _plain_info(info: Mapping[str, Any]) -> Info:
    return {str(k): _plain(v) for k, v in info.items()}


def _flat(value: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in value:
        out.extend(_flat(v) if isinstance(v, list) else [v])
    return out


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value
