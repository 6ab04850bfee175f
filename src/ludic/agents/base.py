"""Agent = ChatClient + ContextStrategy + Parser: an LLM with state.

`act()` makes one or more model calls and returns every call as an AgentStep, the last of
which says what the protocol does next (`action_target`). The agent does not step the env and
does not decide when an episode ends; protocols do.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ludic._aio import run_in_worker
from ludic._log_once import warn_once
from ludic.context.base import CONTEXT_VERSION_KEY, ContextStrategy
from ludic.context.full_dialog import FullDialog
from ludic.inference.client import ChatClient, ChatRequest, ChatResponse
from ludic.inference.sampling import SamplingConfig
from ludic.parsers import (
    DEFAULT_PENALTY,
    Parser,
    check_parse_result,
    identity_parser,
    parser_name,
    takes_one_text,
)
from ludic.types import AgentStep, Info, Message, ParseResult, ToolCall, ToolResult

logger = logging.getLogger(__name__)

INCOMPLETE_FEEDBACK = (
    "Your reply was cut off before it finished (it hit the token limit). Answer more briefly."
)


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentAct:
    """The outcome of one `act()` call.

    `steps` are all model calls made (in order). `parse_result` is set when the last step
    targets the env (its `action` is None on a parse failure). `external_calls` are the tool
    calls the protocol must handle when the last step targets "external".
    """

    steps: tuple[AgentStep, ...]
    parse_result: ParseResult | None = None
    external_calls: tuple[ToolCall, ...] = ()

    @property
    def final_step(self) -> AgentStep:
        return self.steps[-1]

    @property
    def action(self) -> str | None:
        return None if self.parse_result is None else self.parse_result.action


_DEFAULT_SAMPLING = SamplingConfig()


def resolve_sampling(
    request: SamplingConfig | None, agent: SamplingConfig | None
) -> SamplingConfig:
    """The sampling one model call uses: the agent's explicit fields > the request's > the
    defaults (see `Agent`). A field counts as set by the agent when it differs from
    `SamplingConfig()`'s default; the request's seed wins when set; `extras` merge, the agent's
    keys winning."""
    if agent is None:
        return request if request is not None else _DEFAULT_SAMPLING
    if request is None:
        return agent
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(SamplingConfig):
        if f.name in ("seed", "extras"):
            continue
        value = getattr(agent, f.name)
        if value != getattr(_DEFAULT_SAMPLING, f.name):
            changes[f.name] = value
    changes["seed"] = request.seed if request.seed is not None else agent.seed
    changes["extras"] = {**request.extras, **agent.extras}
    return dataclasses.replace(request, **changes)


def derive_call_seed(base_seed: int | None, call_index: int) -> int | None:
    """A distinct, deterministic sampling seed for each model call of an episode."""
    if base_seed is None:
        return None
    return (base_seed * 1_000_003 + call_index * 7_919 + 1) % (2**31 - 1)


class Agent:
    """A plain LLM agent: one model call per `act()`, parsed into an env action.

    Sampling: each call uses `resolve_sampling(request, agent)`, field by field: a field the
    agent's `sampling` sets (differs from `SamplingConfig()`'s default) wins over the request's
    (what `act(sampling=...)` passes: the rollout request's sampling), which wins over the
    defaults. The request's seed, when set, wins (it is the per-episode seed). So
    `Agent(client, sampling=SamplingConfig(max_tokens=4))` always replies in at most 4 tokens.

    A completion cut off by the token limit (`finish_reason == "length"`) goes to the parser
    like any other (its step records `finish_reason`; `BatchStats.num_incomplete` counts them).
    With `reject_incomplete_completions=True` it is instead a parse failure
    (`incomplete_penalty`, `info["incomplete_completion"]`, counted in
    `BatchStats.num_incomplete_rejected`) that the parser never sees; its raw text is still
    added to the context, followed by feedback on the next step. Turn it on when a cut-off
    reply can look valid (a half-written answer) and you want the policy to learn brevity.

    A completion longer than `parse_inline_max_chars` is parsed on a worker thread, so a slow
    parser neither freezes the other episodes nor escapes the episode timeout; shorter ones
    are parsed in place (a thread hop costs more than parsing them). 0: always a thread.
    """

    parse_inline_max_chars: int = 1024

    def __init__(
        self,
        client: ChatClient,
        *,
        context: ContextStrategy | None = None,
        parser: Parser | None = identity_parser,
        sampling: SamplingConfig | None = None,
        agent_id: str = "agent_0",
        system_prompt: str | None = None,
        reject_incomplete_completions: bool = False,
        incomplete_penalty: float = DEFAULT_PENALTY,
    ) -> None:
        _check_client_and_parser(client, parser)
        _check_context_and_sampling(context, sampling)
        self.client = client
        self.context = context if context is not None else FullDialog()
        # None is what env_parser returns for an env without a parser: the reply is the action.
        self.parser: Parser = parser if parser is not None else identity_parser
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.agent_id = agent_id
        self.system_prompt = system_prompt
        self.reject_incomplete_completions = reject_incomplete_completions
        self.incomplete_penalty = incomplete_penalty
        self._calls = 0
        self._step_index = 0
        self._prompt_version = 0  # the context's history version when the prompt was built

    # ---- episode hooks (called by protocols) -------------------------------------------
    def reset(self, system_prompt: str | None = None) -> None:
        """Start a new episode. The agent's own system prompt wins over the env's suggestion."""
        self._calls = 0
        self._step_index = 0
        self.context.reset(self.episode_system_prompt(system_prompt))

    def episode_system_prompt(self, env_prompt: str | None) -> str | None:
        """The system prompt for an episode: the agent's own, else the env's suggestion."""
        return self.system_prompt if self.system_prompt is not None else env_prompt

    def on_env_reset(self, obs: str, info: Info) -> None:
        self.context.on_env_reset(obs, info)

    def on_after_step(self, next_obs: str | None, info: Info) -> None:
        self.context.on_after_step(next_obs, info)

    def on_tool_results(self, results: Sequence[ToolResult]) -> None:
        self.context.on_tool_results(results)

    # ---- acting ---------------------------------------------------------------------------
    async def act(
        self,
        *,
        turn_id: str,
        sampling: SamplingConfig | None = None,
        step_info: Info | None = None,
    ) -> AgentAct:
        """One model call, parsed into an env action (or a recorded parse failure)."""
        response, prompt = await self._call_model(sampling)
        message: Message = {"role": "assistant", "content": response.text}
        self.context.on_after_act(message)
        parse_result, info = await self.parse_completion(response)
        step = self._make_step(
            turn_id=turn_id,
            loop_index=0,
            prompt=prompt,
            response=response,
            action_target="env",
            parse_result=parse_result,
            step_info=step_info,
            info=info,
        )
        return AgentAct(steps=(step,), parse_result=parse_result)

    async def parse_completion(self, response: ChatResponse) -> tuple[ParseResult, Info]:
        """Parse a final completion, rejecting truncated ones when configured."""
        info: Info = {}
        if self.reject_incomplete_completions and response.finish_reason == "length":
            info["incomplete_completion"] = True
            info["parse_error"] = True
            return (
                ParseResult(action=None, reward=self.incomplete_penalty, obs=INCOMPLETE_FEEDBACK),
                info,
            )
        try:
            result = _checked_parse_result(await self._run_parser(response.text), self.parser)
        except Exception as exc:  # a buggy parser is a parse failure, never a crash
            result = ParseResult(
                action=None,
                reward=DEFAULT_PENALTY,
                obs=f"Your reply could not be parsed ({type(exc).__name__}).",
            )
            info["parser_exception"] = f"{type(exc).__name__}: {exc}"
            _report_parser_error(self.parser, exc)
        if result.action is None:
            info["parse_error"] = True
        return result, info

    async def _run_parser(self, text: str) -> ParseResult:
        if len(text) <= self.parse_inline_max_chars:
            return self.parser(text)
        return await run_in_worker(self.parser, text)

    def give_up(self, steps: Sequence[AgentStep], feedback: str) -> AgentAct:
        """End an act whose tool loop hit its cap: the last step becomes a parse failure
        targeting the env, with `info["tool_loop_exhausted"]`."""
        failure = ParseResult(action=None, reward=DEFAULT_PENALTY, obs=feedback)
        last = steps[-1]
        info = {**last.info, "parse_error": True, "tool_loop_exhausted": True}
        final = dataclasses.replace(
            last, action_target="env", parse_result=failure, reward=failure.reward, info=info
        )
        return AgentAct(steps=(*steps[:-1], final), parse_result=failure)

    async def _call_model(
        self, sampling: SamplingConfig | None, tools: Sequence[dict[str, Any]] | None = None
    ) -> tuple[ChatResponse, list[Message]]:
        cfg = resolve_sampling(sampling, self.sampling)
        cfg = cfg.with_seed(derive_call_seed(cfg.seed, self._calls))
        self._calls += 1
        prompt = self.context.on_before_act()
        self._prompt_version = self.context.history_version
        response = await self.client.complete(
            ChatRequest(messages=prompt, sampling=cfg, tools=tools or None)
        )
        return response.with_sampling(cfg), prompt  # the trainer recomputes under it

    def _make_step(
        self,
        *,
        turn_id: str,
        loop_index: int,
        prompt: list[Message],
        response: ChatResponse,
        action_target: str,
        parse_result: ParseResult | None,
        step_info: Info | None,
        info: Info | None = None,
        tool_calls: Sequence[ToolCall] = (),
        tool_results: Sequence[ToolResult] = (),
    ) -> AgentStep:
        merged: Info = {**response.to_info(), **(step_info or {}), **(info or {})}
        merged[CONTEXT_VERSION_KEY] = self._prompt_version  # snapshots are cut where it changes
        step = AgentStep(
            index=self._step_index,
            turn_id=turn_id,
            agent_id=self.agent_id,
            loop_index=loop_index,
            prompt_messages=tuple(prompt),
            completion=response.text,
            trace=response.trace(),
            finish_reason=response.finish_reason,
            policy_version=response.policy_version,
            tool_calls=tuple(tool_calls),
            tool_results=tuple(tool_results),
            action_target=action_target,  # type: ignore[arg-type]
            parse_result=parse_result,
            reward=0.0 if parse_result is None else parse_result.reward,
            info=merged,
        )
        self._step_index += 1
        return step


__all__ = ["INCOMPLETE_FEEDBACK", "Agent", "AgentAct", "derive_call_seed", "resolve_sampling"]


def _checked_parse_result(result: object, parser: Parser) -> ParseResult:
    """The parser's result, or a TypeError naming what it returned instead (a parser that
    returns the action text itself failed the episode with an AttributeError), or what in it
    is not a str / finite number (`check_parse_result`)."""
    if not isinstance(result, ParseResult):
        raise TypeError(
            f"the parser returned {type(result).__name__} {result!r:.60}, not a ParseResult; "
            "return ParseResult(action=..., reward=..., obs=...)"
        )
    return check_parse_result(result, where=f"the parser {parser_name(parser)}")


def _check_context_and_sampling(context: object, sampling: object) -> None:
    """Refuse at construction a context or sampling of the wrong kind (a strategy's class
    instead of an instance, a dict of sampling fields): each failed every episode later
    with an AttributeError naming neither."""
    if context is not None and not isinstance(context, ContextStrategy):
        what = (
            f"the class {context.__name__}"
            if isinstance(context, type)
            else f"{type(context).__name__} {context!r:.60}"
        )
        raise TypeError(
            f"Agent context must be a ContextStrategy instance (or None: FullDialog()), got "
            f"{what}; pass e.g. context=FullDialog() or context=LatestObservationContext()"
        )
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise TypeError(
            f"Agent sampling must be a SamplingConfig (or None), got {type(sampling).__name__} "
            f"{sampling!r:.60}; pass e.g. sampling=SamplingConfig(max_tokens=64)"
        )


def _check_client_and_parser(client: object, parser: object) -> None:
    """Refuse at construction what would otherwise fail on every model call: a client without
    `complete` (an AttributeError per episode) or a parser that is not callable (every reply
    silently a parse failure, since a raising parser is a parse failure by design)."""
    if isinstance(client, type):  # the class has `complete` too, but unbound
        raise TypeError(
            f"Agent needs a ChatClient instance as its first argument, got the class "
            f"{client.__name__}; pass {client.__name__}(...)"
        )
    if not callable(getattr(client, "complete", None)):
        raise TypeError(
            f"Agent needs a ChatClient (an object with `async complete(request)`) as its first "
            f"argument, got {type(client).__name__} {client!r:.60}; pass e.g. "
            "ScriptedClient([...]), EmbeddedEngine(model, tokenizer) or "
            "OpenAICompatibleClient(...)"
        )
    if parser is not None and not callable(parser):
        raise TypeError(
            "Agent parser must be a callable str -> ParseResult (or None: the reply is the "
            f"action), got {type(parser).__name__} {parser!r:.60}; pass e.g. "
            "xml_tag_parser('answer') or env_parser('tictactoe')"
        )
    if parser is not None and not takes_one_text(parser):
        raise TypeError(_one_argument_refusal(parser))


def _one_argument_refusal(parser: object) -> str:
    """Why `parser` cannot be called as `parser(text)`, and the fix. The usual cause: a parser
    set as a class attribute (`parser = xml_tag_parser("move")`) and read from an instance,
    which binds it as a method, so each reply would call it with the env first."""
    name = getattr(parser, "__qualname__", type(parser).__name__)
    if inspect.ismethod(parser):
        owner = type(parser.__self__).__name__
        return (
            f"Agent parser {name}{inspect.signature(parser.__func__)} is a method bound to an "
            f"instance of {owner}, so it cannot be called as parser(reply): read it from the "
            f"class ({owner}.parser), or declare it in the class body as "
            "parser = staticmethod(...)"
        )
    signature = inspect.signature(parser)  # type: ignore[arg-type]
    return (
        f"Agent parser {name}{signature} cannot be called as parser(reply): a parser takes "
        "one argument, the reply text (a method written `def parser(self, text)` needs an "
        "instance: declare it as a @staticmethod taking the text)"
    )


def _report_parser_error(parser: Parser, exc: Exception) -> None:
    """Log, once per parser and exception type, that the parser raised: the reply counts as a
    parse failure, which alone would only show as parse errors and the penalty."""
    name = getattr(parser, "__qualname__", None) or type(parser).__name__
    warn_once(
        logger,
        ("parser", f"{getattr(parser, '__module__', '')}.{name}", type(exc).__name__),
        "the parser %s raised %s: %s; each reply it raises on counts as a parse failure "
        "(penalty %s, recorded in the step's info['parser_exception']). Fix the parser: for a "
        "reply it cannot read, return ParseResult(action=None, reward=..., obs=feedback)",
        name,
        type(exc).__name__,
        exc,
        DEFAULT_PENALTY,
        exc_info=exc,
    )
