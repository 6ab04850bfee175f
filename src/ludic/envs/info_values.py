"""Values that leave user code into a rollout record, checked as JSON where they leave it.

A rollout record is JSON, so an env's `StepOutcome.info` (`check_step_outcome`) and a tool's
result (`ludic.agents.tools`) must hold JSON values. Numpy (and torch) scalars and arrays
become plain Python values, an exception (an env reporting info["critical_error"]) its
"Type: message" text, and values with one standard text form theirs (a datetime, date or time
its ISO text; a Decimal, UUID or path its str), conversions that lose nothing the record keeps; anything else JSON
cannot write is refused naming where it came from (the env method, the tool), the key and
the type, so it fails that episode instead of the rollout log write much later (or, for a
tool, instead of reaching the model as its repr). It does not touch JSON values (a float nan
stays nan) and does not check reset info, which no record keeps.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from ludic._describe import describe_value

_PLAIN = (str, int, float, bool, type(None))
# the modules whose arrays and scalars have an exact plain form (`.tolist()`)
_ARRAY_MODULES = ("numpy", "torch")
_RECORD = "a rollout record (JSON)"
# values with one standard text form: a calendar tool's datetime reads as its ISO text
_ISO = (datetime.datetime, datetime.date, datetime.time)
_TEXT = (decimal.Decimal, uuid.UUID, PurePath)


@dataclass(frozen=True, slots=True)
class _Exit:
    """Where a value leaves user code (`where`, e.g. "MyEnv.env_step") and what holds it."""

    where: str
    holder: str
    advice: str = ""  # what else the fix may be, after the common advice


def jsonable_info(info: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """`info` itself when it holds only JSON values, else a copy with numpy / torch values
    as plain ones; a TypeError names `where` (e.g. "MyEnv.env_step"), the key and the type of
    a value that has no plain form (a set, a custom object, a dict keyed by a tuple)."""
    return _checked(info, _Exit(where, _RECORD, ", or leave it out of info"), "info")  # type: ignore[no-any-return]


def jsonable_value(value: Any, *, where: str, path: str, holder: str = _RECORD) -> Any:
    """`value` itself when it is made of JSON values, else a copy with numpy / torch parts as
    plain ones; a TypeError reads "{where} returned {path}[...] = ..., which {holder} cannot
    hold" for a part with no plain form (`path` names the value, e.g. "its result")."""
    return _checked(value, _Exit(where, holder), path)


def _checked(value: Any, exit_: _Exit, path: str) -> Any:
    try:
        return _plain(value, exit_, path)
    except RecursionError:  # a list or dict that holds itself (or nested thousands deep)
        raise TypeError(
            f"{exit_.where} returned {path} holding itself (a circular reference) or nested "
            f"too deeply, which {exit_.holder} cannot hold; return a copy without the cycle"
        ) from None


def _plain(value: Any, exit_: _Exit, path: str) -> Any:
    """`value` with its numpy / torch parts converted; the same object when nothing was."""
    if type(value) in _PLAIN:
        return value
    if _is_array_like(value):
        return _plain(value.tolist(), exit_, path)  # an object array may hold anything
    if isinstance(value, _PLAIN):  # a subclass (an IntEnum, say): JSON writes its value
        return value
    if isinstance(value, BaseException):  # an env's report (info["critical_error"]): its text
        return f"{type(value).__name__}: {value}"
    if isinstance(value, _ISO):
        return value.isoformat()
    if isinstance(value, _TEXT):
        return str(value)
    if isinstance(value, dict):
        return _plain_dict(value, exit_, path)
    if isinstance(value, (list, tuple)):
        items = [_plain(v, exit_, f"{path}[{i}]") for i, v in enumerate(value)]
        unchanged = all(new is old for new, old in zip(items, value, strict=True))
        return value if unchanged else items
    raise TypeError(_refusal(exit_, path, value))


def _plain_dict(value: dict[Any, Any], exit_: _Exit, path: str) -> dict[Any, Any]:
    converted: dict[Any, Any] = {}
    changed = False
    for key, item in value.items():
        new_key = _plain_key(key, exit_, path)
        new_item = _plain(item, exit_, f"{path}[{key!r}]")
        changed = changed or new_key is not key or new_item is not item
        converted[new_key] = new_item
    return converted if changed else value


def _plain_key(key: Any, exit_: _Exit, path: str) -> Any:
    """A key JSON can write (str, int, float, bool, None), converting a numpy scalar."""
    if isinstance(key, _PLAIN):  # a str Enum member too: JSON writes its value
        return key
    if _is_array_like(key) and getattr(key, "ndim", None) == 0:
        return key.item()
    raise TypeError(
        f"{exit_.where} returned {path} with the key {describe_value(key, qualified=True)}; {exit_.holder} keys "
        "dicts by str (or int, float, bool, None): key it by str(...)"
    )


def _is_array_like(value: object) -> bool:
    module = type(value).__module__.partition(".")[0]
    return module in _ARRAY_MODULES and callable(getattr(value, "tolist", None))


def _refusal(exit_: _Exit, path: str, value: object) -> str:
    return (
        f"{exit_.where} returned {path} = {describe_value(value, qualified=True)}, which {exit_.holder} "
        "cannot hold; put a str, number, bool, None, or a list or dict of them there (e.g. "
        f"str(value), sorted(a_set), dataclasses.asdict(obj)){exit_.advice}"
    )
