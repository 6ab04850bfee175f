"""Whether a setting fits its parameter's annotation, for env constructors (`checked_arguments`)
and `--env-kwargs` (`ludic.eval.env_spec.check_env_kwargs`): int, float (an int too), bool, str,
None, unions, Literal, tuple, list and dict. It is a guard against wrong-typed settings (the
string "0.2" for a float), not a type checker: annotations it does not know accept anything, and
ranges stay the constructor's own checks.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, ParamSpec, TypeVar, Union, get_args, get_origin

from ludic.errors import Refusal

P = ParamSpec("P")
R = TypeVar("R")
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def fits(value: object, annotation: Any) -> bool:
    """Whether `value` is of the type `annotation` names (True for annotations not covered)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is None or annotation is type(None):
        return value is None
    if origin is Union or origin is types.UnionType:
        return any(fits(value, arm) for arm in args)
    if origin is Literal:  # True == 1, so the type must match as well
        return any(value == a and type(value) is type(a) for a in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:  # numbers.Integral: numpy's ints too
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (tuple, list):  # JSON has only arrays: a tuple setting may come as a list
        return isinstance(value, tuple | list) and _items_fit(list(value), args)
    if origin is dict:
        return isinstance(value, dict) and all(
            fits(k, args[0]) and fits(v, args[1]) for k, v in value.items()
        )
    return True


def _items_fit(items: list[object], args: tuple[Any, ...]) -> bool:
    if not args:
        return True
    if (len(args) == 2 and args[1] is Ellipsis) or len(args) == 1:
        return all(fits(item, args[0]) for item in items)
    return len(items) == len(args) and all(fits(i, a) for i, a in zip(items, args, strict=True))


def describe(annotation: Any, *, bool_as: str = "bool") -> str:
    """`annotation` as the message names it: "float (or int)", "one of 'X', 'O'", "int or None";
    a bool as `bool_as`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is None or annotation is type(None):
        return "None"
    if origin is Union or origin is types.UnionType:
        return " or ".join(describe(arm, bool_as=bool_as) for arm in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if annotation is bool:
        return bool_as
    if annotation is float:
        return "float (or int)"
    if isinstance(annotation, type) and origin is None:
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def annotations_of(
    factory: Callable[..., Any], *, with_var_keyword: bool = False
) -> dict[str, Any]:
    """The annotated keyword parameters of `factory` (a function, or a class through its
    `__init__`); empty when they cannot be read or the factory takes `**kwargs` (whatever it
    passes them on to decides), unless `with_var_keyword` (its named ones, then)."""
    try:
        signature = inspect.signature(factory, eval_str=True)
    except Exception:  # no signature, or an annotation naming what only a type checker imports
        return {}
    params = signature.parameters.values()
    if not with_var_keyword and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return {}
    return {
        p.name: p.annotation for p in params if p.kind in _NAMED and p.annotation is not p.empty
    }


def mismatches(factory: Callable[..., Any], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """`(name, annotation)` of each keyword in `kwargs` whose value does not fit `factory`'s
    annotation for it, in the order given."""
    annotations = annotations_of(factory)
    return [
        (name, annotations[name])
        for name, value in kwargs.items()
        if name in annotations and not fits(value, annotations[name])
    ]


def corrected(value: object, annotation: Any) -> object | None:
    """What a string setting likely meant when its JSON reading fits (`"0.2"` -> 0.2), else
    None."""
    if not isinstance(value, str):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if parsed is not None and fits(parsed, annotation) else None


def kwarg_refusal(owner: str, name: str, value: object, annotation: Any) -> str:
    """Why `name=value` does not fit `owner`'s ("Gymnasium env 'FrozenLake-v1'") annotation for
    it, and the `--env-kwargs` to write instead: for an env whose keywords pass through to
    another package's constructor, where `mismatches` on Ludic's factory cannot see them."""
    wanted = describe(annotation, bool_as="true or false")
    fix = corrected(value, annotation)
    write = (
        f"write it without quotes: --env-kwargs '{json.dumps({name: fix})}'"
        if fix is not None
        else f"pass {wanted} for {json.dumps(name)} in --env-kwargs"
    )
    shown = json.dumps(value) if _is_json(value) else repr(value)
    return f"{owner} takes {name!r} as {wanted}, got {shown} ({type(value).__name__}); {write}"


def _is_json(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _kind_fits(value: object, annotation: Any) -> bool:
    """`fits`, with a Literal standing for the types of its values."""
    if get_origin(annotation) is Literal:
        return any(type(value) is type(a) for a in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_kind_fits(value, arm) for arm in get_args(annotation))
    return fits(value, annotation)


class EnvArgumentTypeError(Refusal, TypeError):
    """An env built with a keyword of the wrong type (`checked_arguments`): a TypeError whose
    message names the class, the argument, the type wanted and the fix, so the `ludic` command
    prints it as a refusal, not a traceback."""


def checked_arguments(init: Callable[P, R]) -> Callable[P, R]:
    """Decorate an env's `__init__` so that a keyword of the wrong type (`epsilon="0.2"`) raises
    TypeError naming the class, the argument, the value and the type wanted, before the body
    runs (`EnvArgumentTypeError`). A Literal value of the right type but not allowed
    (`opponent="best"`) is left to the body's own ValueError, as ranges are."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = signature.bind(*args, **kwargs)
        owner = type(bound.arguments["self"]).__name__ if "self" in bound.arguments else ""
        for name, annotation in _hints(init).items():
            if name not in bound.arguments:  # its default, not checked
                continue
            if not _kind_fits(value := bound.arguments[name], annotation):
                fix = corrected(value, annotation)
                hint = f"; pass {name}={fix!r}" if fix is not None else ""
                wanted = describe(annotation, bool_as="true or false")  # as envs' own checks say
                raise EnvArgumentTypeError(
                    f"{owner}: {name} must be {wanted}, got {value!r} "
                    f"({type(value).__name__}){hint}"
                )
        return init(*args, **kwargs)

    return wrapper


@functools.cache
def _hints(init: Callable[..., Any]) -> dict[str, Any]:
    # the named parameters even beside **kwargs (an adapter passing the rest on to a package)
    return annotations_of(init, with_var_keyword=True)
