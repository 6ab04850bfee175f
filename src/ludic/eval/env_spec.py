"""What `--env`, `--parser` and `--env-kwargs` name, for every command (`ludic train`, `eval`,
`actor`): a built-in env or a `module:factory` import string resolved to its factory, a parser
spec resolved against the env's declared parser, keyword arguments checked against what the
factory takes, and one env built to ask it about itself (`with_env`). A factory that returns
something that is not an env is refused naming `--env`; one that raises keeps its traceback (a
bug in the env's code), with a note naming `--env`.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ludic.envs.base import LudicEnv
from ludic.envs.declared_parser import checked_declared_parser
from ludic.errors import is_refusal
from ludic.parsers import Parser, boxed_parser, identity_parser, xml_tag_parser

EnvFactory = Callable[..., LudicEnv]
T = TypeVar("T")


def import_object(spec: str) -> Any:
    """The object named by a `module:attribute` (dotted attribute allowed) import string."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not an import string; write it as 'package.module:name'")
    if module_name.startswith(".") or "/" in module_name or module_name.endswith(".py"):
        raise ValueError(_file_not_module(spec, module_name, attr))
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"cannot import module {module_name!r} from {spec!r}: {e}{_not_found_hint(e, module_name)}"
        ) from e
    except SyntaxError as e:  # the file's own line, not importlib's frames, says what is wrong
        raise ValueError(f"cannot import module {module_name!r} from {spec!r}: {_syntax(e)}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            close = difflib.get_close_matches(part, [n for n in dir(obj) if n[:1] != "_"], n=1)
            meant = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}{meant}") from None
    return obj


def _syntax(error: SyntaxError) -> str:
    """Python's own report of a syntax error, in the lines its traceback would end with:
    `file:line: SyntaxError: message`, the line, and a caret under the column."""
    where = f"{error.filename}:{error.lineno}" if error.lineno else str(error.filename)
    report = f"{where}: {type(error).__name__}: {error.msg}"
    if error.text:
        line = error.text.rstrip("\n")
        caret = " " * (max(error.offset or 1, 1) - 1 - (len(line) - len(line.lstrip()))) + "^"
        report += f"\n    {line.strip()}\n    {caret}"
    return report


def _file_not_module(spec: str, module_name: str, attr: str) -> str:
    """For `./my_env.py:make_env` (a path, or a relative module name, which importlib cannot
    take): the module name to write instead and where to run from."""
    path = Path(module_name.removesuffix(".py"))
    folder = str(path.parent) if str(path.parent) not in (".", "") else "the folder that holds it"
    return (
        f"{spec!r} names a file, not a module: write the module name, "
        f"'{path.name.lstrip('.')}:{attr}', and run from {folder} (the working directory is "
        "importable, as with `python -m`; or add that folder to PYTHONPATH)"
    )


def _not_found_hint(error: ImportError, module_name: str) -> str:
    """Where a missing user module was looked for, when the module itself (not one it
    imports) is what is missing: the usual slip is running from another folder."""
    missing = error.name if isinstance(error, ModuleNotFoundError) else None
    if missing is None or not (module_name == missing or module_name.startswith(missing + ".")):
        return ""
    return (
        f"; looked for {module_name.replace('.', '/')}.py in {Path.cwd()} (the working "
        "directory is importable, as with `python -m`): run from the folder that holds it, or "
        "add that folder to PYTHONPATH"
    )


def resolve_env_factory(name: str) -> EnvFactory:
    """A built-in env's factory by registry name, an ecosystem env by `PREFIX:TARGET`
    (`gymnasium:FrozenLake-v1`, see `ludic.envs.registry.ADAPTER_PREFIXES`), or a user factory
    by `module:factory`."""
    from ludic.envs.registry import adapter_spec

    if (spec := adapter_spec(name)) is not None:
        return spec
    if ":" in name:
        try:
            factory = import_object(name)
        except ValueError as e:
            if not (hint := _adapter_prefix_hint(name)):
                raise
            raise ValueError(f"{e}. {hint}") from e
    else:
        registry = _builtin_envs()
        if name not in registry:
            raise ValueError(
                f"unknown env {name!r}; built-in envs: {sorted(registry)}; or pass a "
                "'module:factory' import string for your own env"
            )
        factory = registry[name]  # an EnvSpec: callable, and carries the env's parser
    if not callable(factory):
        raise ValueError(f"env {name!r} resolves to {factory!r}, which is not callable")
    return factory  # type: ignore[no-any-return]


def _adapter_prefix_hint(name: str) -> str:
    """For `gym:FrozenLake-v1` or `reasoning-gym:countdown` (no such module): the adapter
    prefix it most likely meant, since a failed import alone does not say it."""
    from ludic.envs.registry import ADAPTER_PREFIXES

    prefix, _, target = name.partition(":")
    norm = prefix.replace("-", "_").lower()
    close = [
        p for p in ADAPTER_PREFIXES if len(norm) >= 3 and (p.startswith(norm) or norm.startswith(p))
    ]
    close = close or difflib.get_close_matches(norm, ADAPTER_PREFIXES, n=1, cutoff=0.75)
    if not close or close[0] == prefix:
        return ""
    return (
        f"Did you mean the {close[0]} adapter: --env {close[0]}:{target}? (adapter prefixes: "
        f"{', '.join(ADAPTER_PREFIXES)})"
    )


def resolve_parser(
    spec: str, env_factory: EnvFactory | None = None, env_kwargs: dict[str, Any] | None = None
) -> Parser:
    """A parser from its CLI spelling (see `EvalConfig.parser`). "auto" takes the factory's
    `parser` attribute (an `EnvSpec`'s, or a class attribute of an env class used as its own
    factory), then `default_parser`; with `env_kwargs`, a factory function's env is built
    once to read its class's `parser`; else `identity_parser`."""
    if spec == "auto":
        return declared_parser(env_factory, env_kwargs) or identity_parser
    if spec == "identity":
        return identity_parser
    if spec == "boxed":
        return boxed_parser()
    if spec == "xml:":
        raise ValueError("--parser xml: needs a tag, e.g. xml:move (the text inside <move>...)")
    if spec.startswith("xml:"):
        return xml_tag_parser(spec[4:])
    if ":" in spec:
        parser = import_object(spec)
        if callable(parser):
            return parser  # type: ignore[no-any-return]
    raise ValueError(
        f"unknown parser {spec!r}; use auto, identity, boxed, xml:TAG or 'module:function'"
    )


def declared_parser(
    env_factory: EnvFactory | None, env_kwargs: dict[str, Any] | None = None
) -> Parser | None:
    """The parser the env declares (what `--parser auto` takes), or None: the factory's
    `parser` attribute (an `EnvSpec`'s, or a class attribute of an env class used as its own
    factory), then its `default_parser`; with `env_kwargs`, a factory function's env is built
    once to read its class's `parser`. A declaration no Agent could call as `parser(reply)`
    (a `def parser(self, text)` method, a str) is refused here, naming the env's file
    (`checked_declared_parser`)."""
    owner: object = env_factory
    suggested = getattr(env_factory, "parser", None) or getattr(env_factory, "default_parser", None)
    if suggested is None and env_factory is not None and env_kwargs is not None:
        owner, suggested = with_env(
            env_factory, env_kwargs, lambda env: (type(env), getattr(type(env), "parser", None))
        )
    return checked_declared_parser(suggested, owner)


def check_env_kwargs(env_factory: EnvFactory, env_kwargs: dict[str, Any]) -> None:
    """Refuse `--env-kwargs` that the env factory's signature cannot take (an unknown or a
    missing keyword, or a value its annotation refuses: `"0.2"` for a float, see
    `ludic.envs.arg_types`), naming the factory and the fix, before anything is built.
    A factory whose signature cannot be read, or that takes `**kwargs`, is not checked here."""
    from ludic.envs.registry import EnvSpec

    target = env_factory.factory if isinstance(env_factory, EnvSpec) else env_factory
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**env_kwargs)
    except TypeError as e:
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        takes = [n for n, p in signature.parameters.items() if p.kind in named]
        required = [
            n
            for n, p in signature.parameters.items()
            if p.kind in named and p.default is inspect.Parameter.empty and n not in env_kwargs
        ]
        given = json.dumps(env_kwargs, default=repr)  # Python callers may pass any object
        takes_text = ", ".join(takes) if takes else "no keyword arguments (pass --env-kwargs '{}')"
        fix = ""
        if required:  # e.g. (pass them: --env-kwargs '{"size": ...}')
            fields = ", ".join(f"{json.dumps(n)}: ..." for n in required)
            fix = f" (pass them: --env-kwargs '{{{fields}}}')"
        raise ValueError(
            f"--env-kwargs {given} does not fit env {_factory_name(env_factory)!r}: {e}; it "
            f"takes {takes_text}{fix}"
        ) from None
    _check_env_kwarg_types(env_factory, target, env_kwargs)


def _check_env_kwarg_types(
    env_factory: EnvFactory, target: Callable[..., Any], env_kwargs: dict[str, Any]
) -> None:
    """Refuse the first `--env-kwargs` value whose type the factory's annotation refuses,
    naming the env, the key, the value, the type wanted and the corrected flag."""
    from ludic.envs.arg_types import corrected, describe, mismatches

    wrong = mismatches(target, env_kwargs)
    if not wrong:
        return
    key, annotation = wrong[0]
    value = env_kwargs[key]
    fix = corrected(value, annotation)
    if fix is not None:  # "0.2" -> 0.2: the same flag without the quotes
        flag = json.dumps({**env_kwargs, key: fix}, default=repr)
        how = f"write it without quotes: --env-kwargs '{flag}'"
    else:
        null = " (None is null in JSON)" if "None" in describe(annotation) else ""
        how = f"pass {describe(annotation)} for {json.dumps(key)} in --env-kwargs{null}"
    raise ValueError(
        f"--env-kwargs: env {_factory_name(env_factory)!r} takes {key!r} as "
        f"{describe(annotation)}, got {json.dumps(value, default=repr)} ({type(value).__name__}); "
        f"{how}"
    )


def _factory_name(env_factory: EnvFactory) -> str:
    from ludic.envs.registry import EnvSpec

    if isinstance(env_factory, EnvSpec):
        return env_factory.name
    return str(getattr(env_factory, "__qualname__", env_factory))


def _as_typed(env_factory: EnvFactory) -> str:
    """`module:factory` (or a built-in's name), as `--env` names it."""
    name = _factory_name(env_factory)
    module = getattr(env_factory, "__module__", None)
    return (
        name if module is None or ":" in name or module.startswith("ludic.") else f"{module}:{name}"
    )


def _check_is_env(env: Any, env_factory: EnvFactory) -> None:
    """Refuse what a factory returned when it is not an env (no `reset`, `step`, `agent_ids`
    and `close`), e.g. None from a factory that forgot its `return`."""
    # looked up on the type: an env's `agent_ids` property may not answer before `reset`
    if all(hasattr(type(env), name) for name in ("reset", "step", "agent_ids", "close")):
        return
    raise ValueError(
        f"env factory {_factory_name(env_factory)!r} returned {_short_repr(env)}, not an env: "
        "it must return a LudicEnv (e.g. an instance of your SingleAgentEnv subclass; a "
        "function that builds one needs `return env`)"
    )


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"


def with_env(env_factory: EnvFactory, env_kwargs: dict[str, Any], read: Callable[[Any], T]) -> T:
    """`read` applied to one env built by `env_factory`, which is then closed (an async
    `close()` is awaited); what train, eval and the actor use to ask an env about itself.
    Keywords the factory does not take are refused first (`check_env_kwargs`), and so is
    anything it returns that is not an env."""
    check_env_kwargs(env_factory, env_kwargs)
    try:
        env = env_factory(**env_kwargs)
    except Exception as e:  # the env's own code: its traceback is the user's to read
        if not is_refusal(e):  # ludic's adapters already say what is wrong and what to do
            e.add_note(f"(raised by the env's own code: --env {_as_typed(env_factory)})")
        raise
    _check_is_env(env, env_factory)
    try:
        return read(env)
    finally:
        closed = env.close()
        if inspect.isawaitable(closed):
            asyncio.run(_await(closed))


async def _await(awaitable: Any) -> None:
    await awaitable


def _builtin_envs() -> dict[str, Any]:
    registry = getattr(importlib.import_module("ludic.envs"), "BUILTIN_ENVS", None)
    if registry is None:
        raise ValueError(
            "this install has no built-in env registry (ludic.envs.BUILTIN_ENVS); pass your "
            "env as a 'module:factory' import string"
        )
    return dict(registry)
