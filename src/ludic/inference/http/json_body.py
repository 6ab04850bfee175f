"""How `ludic serve` reads a JSON request body: its size in values bounded before it is parsed,
a key given twice in one object refused, and nesting past `MAX_JSON_DEPTH` refused. `json_route_class` gives FastAPI the route class
that reads bodies so; it leaves validating the parsed body to FastAPI and the request models.

Parsing holds the GIL (the json module's C scanner and pydantic's validators run no bytecode),
so a worker thread would not keep the event loop free: an 8 MiB body of four million token ids
took ~1.5 s to parse and validate, and one of `[[],[],...]` ~6 s, with every other client
waiting. What parsing costs grows with the number of values, not bytes (a long string is
cheap), and no request a server can serve holds more than its context's worth of them, so
such a body is refused (413) from a count of its commas and opening brackets, which takes
milliseconds, before it is parsed. It does not bound requests under the count (a request at
the context parses in milliseconds).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

__all__ = [
    "MAX_JSON_DEPTH",
    "MIN_JSON_VALUES",
    "VALUES_PER_CONTEXT_TOKEN",
    "DuplicateKey",
    "JSONBound",
    "TooDeep",
    "json_route_class",
    "max_json_values",
    "parse_bounded",
]

MIN_JSON_VALUES = 65536
"""The fewest commas and opening brackets a body may hold, whatever the context."""
VALUES_PER_CONTEXT_TOKEN = 8
"""Commas and opening brackets allowed per token of context beyond `MIN_JSON_VALUES`: a
token-in prompt has one comma per token, text rarely more than a few per token."""
MAX_JSON_DEPTH = 100
"""The deepest nesting of lists and objects read. Tool schemas nest a few levels; a chat
template rendering ~900 failed with 'maximum recursion depth exceeded', naming neither."""


class TooDeep(ValueError):
    """The body's JSON nests lists and objects deeper than `MAX_JSON_DEPTH`."""

    def __init__(self, depth: int) -> None:
        super().__init__(
            f"the body's JSON nests lists and objects {depth} levels deep, more than the "
            f"{MAX_JSON_DEPTH} this server reads; send a flatter JSON object"
        )


class DuplicateKey(ValueError):
    """A JSON object gives one key twice: parsers disagree on which one counts (Python's
    takes the last), so a proxy or log and the server could read different requests."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"the body's JSON gives the key {key!r} twice in one object; send each key once"
        )


def max_json_values(max_model_len: int) -> int:
    """The most commas and opening brackets a body for a `max_model_len` context may hold."""
    return max(MIN_JSON_VALUES, VALUES_PER_CONTEXT_TOKEN * max_model_len)


@dataclass(frozen=True, kw_only=True, slots=True)
class JSONBound:
    """The most commas and opening brackets a route's JSON body may hold (`limit`), what that
    covers (`covers`: "a request within this server's 2048-token context can use") and what a
    client over it should do (`fix`), for its 413."""

    limit: int
    covers: str
    fix: str

    @classmethod
    def for_context(cls, max_model_len: int, model_len: int | None = None) -> JSONBound:
        """The bound of the completion endpoints (and the logprob probe) of a served context;
        a longer one is offered only where `max_model_len` caps `model_len`, the model's own
        (past it `ludic serve --max-model-len` is refused)."""
        fix = "send a shorter prompt (token ids past the context are refused anyway)"
        if model_len is not None and model_len > max_model_len:
            fix += f", or serve a longer context (--max-model-len up to {model_len})"
        return cls(
            limit=max_json_values(max_model_len),
            covers=f"a request within this server's {max_model_len}-token context can use",
            fix=fix,
        )


def json_route_class(bound: JSONBound) -> type[APIRoute]:
    """An `APIRoute` whose JSON bodies are parsed by `parse_bounded`: over `bound` a 413 before
    parsing; a duplicate key or nesting too deep a `DuplicateKey` or `TooDeep`, which FastAPI
    raises as the cause of its 400. FastAPI reads a body before a route's dependencies run, a
    bearer-token check included, so the bound also holds for clients without the token. Set it
    as `app.router.route_class` before adding routes (or an `APIRouter`'s `route_class`)."""

    class BoundedRequest(Request):
        async def json(self) -> Any:
            if not hasattr(self, "_json"):
                self._json = parse_bounded(await self.body(), bound)
            return self._json

    class BoundedJSONRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def bounded(request: Request) -> Response:
                return await handler(BoundedRequest(request.scope, request.receive))

            return bounded

    return BoundedJSONRoute


def parse_bounded(body: bytes, bound: JSONBound) -> Any:
    """`body` parsed as JSON (UTF-8, a BOM allowed, as `json.loads` reads bytes); HTTPException
    413 when it holds more than `bound.limit` commas and opening brackets (inside strings too:
    an overcount only for text far longer than any context), `DuplicateKey` for a key
    repeated, `TooDeep` for nesting past `MAX_JSON_DEPTH`."""
    opens = body.count(b"[") + body.count(b"{")
    if len(body) > bound.limit:  # fewer bytes cannot hold more
        count = body.count(b",") + opens
        if count > bound.limit:
            raise HTTPException(
                413,
                f"the body's JSON holds {count} commas and opening brackets, more than "
                f"{bound.covers} (at most {bound.limit} are read); {bound.fix}",
            )
    parsed = json.loads(body, object_pairs_hook=_unique_keys)
    if opens > MAX_JSON_DEPTH and (depth := _depth(parsed)) > MAX_JSON_DEPTH:
        raise TooDeep(depth)  # fewer brackets (most bodies) cannot nest deeper: not walked
    return parsed


def _depth(value: Any) -> int:
    """How deep lists and objects nest in `value` (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj
