"""Tools: schemas from typed callables, argument validation, tool-call parsing, safe execution."""

from __future__ import annotations

import json
from typing import Any, Literal, Optional

import pytest

from ludic.agents.tools import (
    INVALID_TOOL,
    Tool,
    execute_tool,
    parse_tool_calls,
    tool_from_callable,
    validate_arguments,
)
from ludic.types import ToolCall


def search(
    query: str,
    limit: int,
    threshold: float = 0.5,
    exact: bool = False,
    tags: list[str] | None = None,
    mode: Literal["fast", "slow"] = "fast",
    page: Optional[int] = None,  # noqa: UP045 - the typing spelling must work too
    raw: list = [],  # noqa: B006 - a bare list annotation
) -> str:
    """Search the corpus.

    Longer explanation that is not part of the description.

    Args:
        query: What to look for.
        limit (int): How many hits
            at most (continuation lines are not kept).
        mode: Speed.

    Returns:
        The hits.
    """
    return f"{query}:{limit}:{threshold}:{exact}:{tags}:{mode}:{page}:{raw}"


def test_schema_from_typed_callable() -> None:
    schema = tool_from_callable(search).schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "search" and fn["description"] == "Search the corpus."
    params = fn["parameters"]
    assert params["type"] == "object" and params["required"] == ["query", "limit"]
    assert params["properties"] == {
        "query": {"type": "string", "description": "What to look for."},
        "limit": {"type": "integer", "description": "How many hits"},
        "threshold": {"type": "number"},
        "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"type": "string", "enum": ["fast", "slow"], "description": "Speed."},
        "page": {"type": "integer"},
        "raw": {"type": "array"},
    }
    json.dumps(schema)  # goes to an OpenAI server as is


def test_schema_for_unions_dicts_any_and_names() -> None:
    def f(a: int | str, b: dict[str, int], c: Any, d: tuple[int, ...], e: Literal[1, "x"]) -> None:
        pass

    tool = tool_from_callable(f, name="renamed")
    props = tool.parameters["properties"]
    assert tool.name == "renamed" and tool.description == "renamed"  # no docstring
    assert props["a"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["b"] == {"type": "object"} and props["c"] == {}
    assert props["d"] == {"type": "array", "items": {"type": "integer"}}
    assert props["e"] == {"enum": [1, "x"]}  # mixed literal types: no single type


def test_unsupported_signatures_are_refused_clearly() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    def star(*args: int) -> None:
        pass

    def weird(x: set[int]) -> None:
        pass

    with pytest.raises(TypeError, match="needs a type hint"):
        tool_from_callable(untyped)
    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):
        tool_from_callable(star)
    with pytest.raises(TypeError, match="has no JSON schema"):
        tool_from_callable(weird)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ([1, 2], "arguments must be a JSON object, got list"),
        ({"query": "q"}, "missing required argument(s): limit"),
        ({"query": "q", "limit": 1, "colour": 2}, "unknown argument(s): colour"),
        ({"query": 1, "limit": 1}, "argument 'query' must be string, got int"),
        ({"query": "q", "limit": 1.5}, "argument 'limit' must be integer, got float"),
        ({"query": "q", "limit": True}, "argument 'limit' must be integer, got bool"),
        ({"query": "q", "limit": 1, "threshold": "hi"}, "'threshold' must be number"),
        ({"query": "q", "limit": 1, "exact": 1}, "'exact' must be boolean"),
        ({"query": "q", "limit": 1, "mode": "medium"}, "'mode' must be one of ['fast', 'slow']"),
        ({"query": "q", "limit": 1, "tags": ["a", 2]}, "argument 'tags[1]' must be string"),
        ({"query": "q", "limit": None}, "argument 'limit' must be integer, got NoneType"),
    ],
)
def test_argument_validation_errors(arguments: Any, problem: str) -> None:
    error = validate_arguments(tool_from_callable(search), arguments)
    assert error is not None and problem in error


def test_valid_arguments_pass_and_optional_none_is_allowed() -> None:
    tool = tool_from_callable(search)
    assert (
        validate_arguments(tool, {"query": "q", "limit": 2, "threshold": 1, "page": None}) is None
    )


async def test_execute_runs_sync_and_async_tools_and_serialises_results() -> None:
    async def add(a: int, b: int) -> dict[str, int]:
        """Add."""
        return {"sum": a + b}

    call = ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
    result = await execute_tool(tool_from_callable(add), call)
    assert (result.tool_call_id, result.name, result.content, result.is_error) == (
        "c1",
        "add",
        '{"sum": 5}',
        False,
    )
    ok = await execute_tool(
        tool_from_callable(search), ToolCall(id="c", name="search", arguments="")
    )
    assert ok.is_error and "missing required" in ok.content  # empty arguments mean {}


def boom(x: int) -> str:
    """Fails."""
    raise RuntimeError(f"bad {x}")


@pytest.mark.parametrize(
    ("tool", "arguments", "problem"),
    [
        (None, "{}", "unknown tool 'f'"),
        (Tool(name="f", description="", parameters={}), "{}", "unknown tool 'f'"),
        (tool_from_callable(boom), "{not json", "not valid JSON"),
        (tool_from_callable(boom), "[[[[" * 10_000, "not valid JSON"),
        (tool_from_callable(boom), '{"x": ' + "9" * 5000 + "}", "not valid JSON"),
        (tool_from_callable(boom), "null", "must be a JSON object"),
        (tool_from_callable(boom), '{"x": "1"}', "must be integer"),
        (tool_from_callable(boom), '{"x": 1}', "RuntimeError: bad 1"),
    ],
)
async def test_execute_turns_every_problem_into_an_error_result(
    tool: Tool | None, arguments: str, problem: str
) -> None:
    result = await execute_tool(tool, ToolCall(id="c", name="f", arguments=arguments))
    assert result.is_error and result.tool_call_id == "c"
    assert result.content.startswith("Error: ") and problem in result.content


async def test_long_results_are_cut() -> None:
    def long() -> str:
        """Long."""
        return "x" * 50

    result = await execute_tool(
        tool_from_callable(long), ToolCall(id="c", name="long", arguments="{}"), max_chars=10
    )
    assert result.content == "x" * 10 + "... [truncated 40 chars]" and not result.is_error


def test_parse_tool_calls_good_and_malformed_blocks() -> None:
    text = (
        "<think>hm</think>"
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "s", "arguments": "{\\"q\\": 1}"}</tool_call>'
        "<tool_call>{oops</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        "<tool_call>[1, 2]</tool_call>"
        "<tool_call>" + "[" * 5000 + "</tool_call>"
        '<tool_call>{"name": "unclosed"'
    )
    parsed = parse_tool_calls(text)
    assert [(c.name, p is None) for c, p in parsed] == [
        ("add", True),
        ("s", True),
        (INVALID_TOOL, False),
        (INVALID_TOOL, False),
        (INVALID_TOOL, False),
        (INVALID_TOOL, False),
    ]
    assert json.loads(parsed[0][0].arguments) == {"a": 1}
    assert parsed[1][0].arguments == '{"q": 1}'  # string arguments are kept as written
    assert parsed[2][0].arguments == "{oops" and "not valid JSON" in (parsed[2][1] or "")
    assert 'string "name"' in (parsed[3][1] or "")
    assert len({c.id for c, _ in parsed}) == len(parsed)  # distinct call ids
    assert parse_tool_calls("no calls") == []
