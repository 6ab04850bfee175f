"""Tools from typed Python callables: OpenAI tool schemas, argument validation, tool-call
parsing from completion text, and safe execution.

A tool is a plain (sync or async) function with type hints and a docstring. Its name is the
function name, its description the docstring's first paragraph, and parameter descriptions come
from an "Args:" section. Execution never raises for what the model did (an unknown tool, bad
arguments, a tool that raises): those become `ToolResult(is_error=True)` the model reads. A
tool that returns a value JSON cannot hold (a set, an object) is the tool's bug, not the
model's: `ToolResultTypeError` fails that episode naming the tool (numpy / torch values are
converted, as for env step info). A sandbox that never started (`SandboxStartError`) is the
host's failure: it fails that episode too, instead of teaching the model about the host. Sync
tools run on a worker thread, so a blocking one holds only its own episode. It does not sandbox
code; see `ludic.sandbox` for untrusted code.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ludic._aio import call_off_loop
from ludic._log_once import warn_once
from ludic.envs.info_values import jsonable_value
from ludic.parsers import tag_blocks
from ludic.sandbox.records import SandboxStartError
from ludic.types import ToolCall, ToolResult, new_id

logger = logging.getLogger(__name__)

_JSON_TYPES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Tool:
    """A callable with its OpenAI schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] | None = None

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def _json_schema(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        enum: dict[str, Any] = {"enum": list(args)}
        kinds = {type(a) for a in args}
        if len(kinds) == 1 and (kind := kinds.pop()) in _JSON_TYPES:
            enum["type"] = _JSON_TYPES[kind]
        return enum
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _json_schema(non_none[0])
        return {"anyOf": [_json_schema(a) for a in non_none]}
    if origin in (list, tuple, Sequence):
        schema: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _json_schema(args[0])
        return schema
    if origin in (dict, Mapping):
        return {"type": "object"}
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    if tp is Any:
        return {}
    raise TypeError(
        f"tool parameter type {tp!r} has no JSON schema; use str, int, float, bool, "
        "list, dict, Literal or Optional of those"
    )


def _doc_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    match = re.search(
        r"^(?:Args|Arguments|Parameters):\s*\n(.*?)(?:\n\s*\n|\Z)", doc, re.DOTALL | re.MULTILINE
    )
    if match:
        for line in match.group(1).splitlines():
            m = re.match(r"\s*(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)", line)
            if m:
                params[m.group(1)] = m.group(2).strip()
    return description, params


def tool_from_callable(fn: Callable[..., Any], *, name: str | None = None) -> Tool:
    """Build a Tool (schema + function) from a typed callable."""
    hints = typing.get_type_hints(fn)
    description, param_docs = _doc_parts(fn.__doc__)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs are not supported")
        if pname not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {pname!r} needs a type hint")
        prop = _json_schema(hints[pname])
        if pname in param_docs:
            prop["description"] = param_docs[pname]
        properties[pname] = prop
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return Tool(
        name=name or fn.__name__,
        description=description or (name or fn.__name__),
        parameters={"type": "object", "properties": properties, "required": required},
        fn=fn,
    )


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    return obj if isinstance(obj, Tool) else tool_from_callable(obj)


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _check_value(name: str, value: Any, schema: Mapping[str, Any]) -> str | None:
    if "enum" in schema and value not in schema["enum"]:
        return f"argument {name!r} must be one of {schema['enum']}, got {value!r}"
    if "anyOf" in schema:
        if all(_check_value(name, value, s) for s in schema["anyOf"]):
            return f"argument {name!r} has the wrong type ({type(value).__name__})"
        return None
    t = schema.get("type")
    if t and not _TYPE_CHECKS[t](value):
        return f"argument {name!r} must be {t}, got {type(value).__name__}"
    if t == "array" and "items" in schema:
        for i, item in enumerate(value):
            error = _check_value(f"{name}[{i}]", item, schema["items"])
            if error:
                return error
    return None


def validate_arguments(tool: Tool, arguments: Any) -> str | None:
    """An error message for invalid arguments, or None when they match the schema."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    props: dict[str, Any] = tool.parameters.get("properties", {})
    missing = [p for p in tool.parameters.get("required", []) if p not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    unknown = [a for a in arguments if a not in props]
    if unknown:
        return f"unknown argument(s): {', '.join(unknown)}; expected {sorted(props)}"
    for name, value in arguments.items():
        if value is None and name not in tool.parameters.get("required", []):
            continue
        error = _check_value(name, value, props[name])
        if error:
            return error
    return None


async def execute_tool(tool: Tool | None, call: ToolCall, *, max_chars: int = 4000) -> ToolResult:
    """Run one call; any problem (unknown tool, bad JSON, bad args, exception) is an error result.
    A result JSON cannot hold raises `ToolResultTypeError` (`tool_result_text`): the tool's bug,
    which fails the episode. A `SandboxStartError` from the tool (e.g. bwrap could not create
    its namespaces) is raised again naming the tool: the host failed, not the model's code, so
    the episode fails (the engine records why and the batch goes on) rather than the model
    reading "Error: SandboxStartError" as the result of its call.

    A sync tool runs on a worker thread, as env methods do: a tool that blocks (a network call,
    a subprocess, a slow computation) holds its own episode only, and the engine's
    `episode_timeout_s` bounds it. An async tool runs on the event loop."""

    def error(msg: str) -> ToolResult:
        return ToolResult(
            tool_call_id=call.id, name=call.name, content=f"Error: {msg}", is_error=True
        )

    if tool is None or tool.fn is None:
        return error(f"unknown tool {call.name!r}")
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, huge ints, deep nesting
        return error(f"tool arguments are not valid JSON ({_json_problem(exc)})")
    problem = validate_arguments(tool, arguments)
    if problem:
        return error(problem)
    try:
        value = await call_off_loop(tool.fn, **arguments)  # a sync tool on a worker thread
    except SandboxStartError as exc:
        raise SandboxStartError(f"tool {call.name!r}: {exc}") from exc
    except Exception as exc:  # a tool that raises must not crash the episode
        _report_tool_error(call.name, exc)
        return error(f"{type(exc).__name__}: {exc}")
    content = tool_result_text(value, tool_name=call.name)
    if len(content) > max_chars:
        content = content[:max_chars] + f"... [truncated {len(content) - max_chars} chars]"
    return ToolResult(tool_call_id=call.id, name=call.name, content=content)


class ToolResultTypeError(TypeError):
    """A tool's result that JSON cannot hold: the tool's bug, so it fails the episode (the
    engine records it, the batch goes on) instead of reaching the model as an error result
    or as the object's repr."""


_TOOL_RESULT_HOLDER = "a tool result (JSON text for the model and the rollout record)"


def tool_result_text(value: object, *, tool_name: str) -> str:
    """The text the model reads for a tool's return `value`: a str as is, else its JSON, with
    numpy / torch values as plain ones (`np.int64(3)` reads `3`, not `"3"`). A value JSON
    cannot hold raises ToolResultTypeError naming the tool, where in the value and its type
    (`json.dumps(default=str)` would hand the model `"{1, 2}"` or `"<Obj object at 0x...>"`)."""
    if isinstance(value, str):
        return value
    try:  # JSON values (the common result) in one C pass; a walk only for what it refuses
        return json.dumps(value)
    except (TypeError, ValueError):  # numpy parts, sets, objects, a cycle: named below
        pass
    where = f"tool {tool_name!r}"
    try:
        plain = jsonable_value(value, where=where, path="result", holder=_TOOL_RESULT_HOLDER)
    except TypeError as exc:
        raise ToolResultTypeError(str(exc)) from None
    return json.dumps(plain)


def _report_tool_error(name: str, exc: Exception) -> None:
    """Log a tool's exception once per tool and exception type: the model sees it as an error
    result, but a tool that fails on every call (a bug, an object bound to another thread such
    as a sqlite3 connection: sync tools run on worker threads) must not fail in silence."""
    warn_once(
        logger,
        ("tool", name, type(exc).__name__),
        "tool %r raised %s: %s (given to the model as an error result; sync tools run on a "
        "worker thread, so objects bound to one thread must be made inside the tool or the "
        "tool written as async def)",
        name,
        type(exc).__name__,
        exc,
    )


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at char {exc.pos}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)


INVALID_TOOL = "<invalid>"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def strip_tool_calls(text: str) -> str:
    """`text` without its `<tool_call>...</tool_call>` blocks: the assistant message content
    to store next to the parsed `tool_calls` (chat templates render the calls from
    `tool_calls`, so keeping the blocks in the content too would show every call twice).
    The whitespace before each block goes with it. Linear in `text` (`tag_blocks`)."""
    pieces: list[str] = []
    pos = 0
    for start, _, _, end in tag_blocks(text, _OPEN, _CLOSE):
        pieces.append(text[pos:start].rstrip())
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces).strip()


def parse_tool_calls(text: str) -> list[tuple[ToolCall, str | None]]:
    """Hermes/Qwen-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks.

    Returns `(call, problem)` pairs. A malformed block becomes a call named "<invalid>" whose
    arguments hold the raw text, with a problem message the agent is told about.
    """
    parsed: list[tuple[ToolCall, str | None]] = []
    blocks = tag_blocks(text, _OPEN, _CLOSE)  # linear: completions are hostile text
    for raw in (text[content_start:content_end] for _, content_start, content_end, _ in blocks):
        call_id = "call_" + new_id()[:12]
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            problem = f"tool call is not valid JSON ({_json_problem(exc)})"
            parsed.append((ToolCall(id=call_id, name=INVALID_TOOL, arguments=raw.strip()), problem))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            problem = 'tool call must be a JSON object with a string "name"'
            parsed.append((ToolCall(id=call_id, name=INVALID_TOOL, arguments=raw.strip()), problem))
            continue
        args = obj.get("arguments", {})
        args_text = args if isinstance(args, str) else json.dumps(args)
        parsed.append((ToolCall(id=call_id, name=obj["name"], arguments=args_text), None))
    return parsed
