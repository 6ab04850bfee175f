"""Which model name a command sends to its OpenAI-compatible servers, asked of their
`/v1/models` before any episode: `served_model_for` (--served-model, else the one model the
first server lists), `check_served_model` (a name a server that routes by name does not list is
refused; others, such as SGLang, get a warning), `served_model_name`, `served_models` and
`model_cards`. Each refusal names the settings as its caller's user gave them: `spell=as_flag`
(the default, for a `ludic` command: `--served-model`) or `as_argument` (from Python:
`served_model=`), defined here since `ludic.recipes.inference` imports this module (and
re-exports all of it). Importing it is light (no torch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ludic.recipes.inference import ServerUrls

_LOG = logging.getLogger(__name__)
Spell = Callable[[str], str]
"""How a refusal names a setting, given its flag: as the caller's user gave it."""


def as_flag(flag: str) -> str:
    """A `ludic` command's spelling of a setting: the flag itself (`--api-key`)."""
    return flag


def as_argument(flag: str) -> str:
    """A Python caller's spelling of a setting: its argument (`--api-key`: `api_key=`)."""
    return flag.removeprefix("--").replace("-", "_") + "="


def _given(spell: Spell, flag: str, value: str) -> str:
    """A setting with its value, as the caller's user gave it: `--served-model tiny` (a
    command), `served_model='tiny'` (Python)."""
    return f"{flag} {value}" if spell is as_flag else f"{spell(flag)}{value!r}"


ROUTES_BY_NAME = frozenset({"ludic", "vllm"})
"""The `/v1/models` cards' `owned_by` of servers that answer a model name they do not list with
a 404 (`ludic serve`, vLLM). Others may not: SGLang's OpenAI routes ignore the request's model."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCard:
    """One model a server lists at `/v1/models`: its name and who serves it (`owned_by`)."""

    id: str
    owned_by: str | None
    max_model_len: int | None = None
    """The longest prompt plus completion the server takes for it (`ludic serve`, vLLM)."""


class ModelsUnauthorized(ValueError):
    """A server's `/v1/models` answered 401 or 403: it wants an API key not sent (or not this
    one); its inference requests would be refused the same way."""


Ask = Callable[[str], "list[ModelCard]"]
"""How a check asks a server (its URL) for its `/v1/models` cards: `model_cards` by default."""


class _AskedOnce:
    """Each server's `/v1/models` asked once for one `served_model_for` (its cards, or the
    ValueError saying why not, kept), so its name and context checks read one answer."""

    def __init__(self, api_key: str | None, spell: Spell) -> None:
        self.api_key, self.spell = api_key, spell
        self.answers: dict[str, list[ModelCard] | ValueError] = {}

    def __call__(self, url: str) -> list[ModelCard]:
        if url not in self.answers:
            try:
                self.answers[url] = model_cards(url, self.api_key, spell=self.spell)
            except ValueError as e:  # ModelsUnauthorized too: raised again at each ask
                self.answers[url] = e
        answer = self.answers[url]
        if isinstance(answer, ValueError):
            raise answer
        return answer


def _asker(ask: Ask | None, api_key: str | None, spell: Spell) -> Ask:
    return ask or (lambda url: model_cards(url, api_key, spell=spell))


def served_model_name(
    server_url: str, api_key: str | None = None, *, spell: Spell = as_flag, ask: Ask | None = None
) -> str:
    """The one model an OpenAI-compatible server serves, from its `/v1/models` (`spell`: how
    refusals name the settings, `as_argument` from Python; `ask`: how to ask it)."""
    names = [card.id for card in _asker(ask, api_key, spell)(server_url)]
    setting = spell("--served-model")
    if not names:
        raise ValueError(
            f"{_models_url(server_url)} lists no model, so there is no model name to send: "
            f"pass {setting} with the name the server serves (or wait until it has loaded one)"
        )
    if len(names) != 1:
        raise ValueError(
            f"{_models_url(server_url)} serves {', '.join(names)}; choose one with {setting}"
        )
    return names[0]


def served_model_for(
    urls: Sequence[str],
    served_model: str | None,
    api_key: str | None,
    *,
    max_tokens: int | None = None,
    spell: Spell = as_flag,
) -> str:
    """The model name to send to every server in `urls`: `served_model` (--served-model), else
    the one model the first server lists at `/v1/models`; refused (`check_served_model`) where
    another server's `/v1/models` does not list it, since a `ServerPool` asks each of them for
    that one name and every request to such a server fails with a 404. `api_key` is what the
    client sends on inference requests; `spell`: how refusals name the settings. With
    `max_tokens` (the episodes' completion budget), a server whose card gives the model a
    `max_model_len` at or below it is refused too (`check_context_room`). Each server is asked
    once for both checks."""
    ask = _AskedOnce(api_key, spell)
    if served_model:
        check_served_model(urls, served_model, api_key, spell=spell, ask=ask)
        name = served_model
    else:
        name = served_model_name(urls[0], api_key, spell=spell, ask=ask)
        check_served_model(urls[1:], name, api_key, listed_by=urls[0], spell=spell, ask=ask)
    if max_tokens is not None:
        check_context_room(urls, name, max_tokens, api_key, spell=spell, ask=ask)
    return name


def check_context_room(
    urls: Sequence[str],
    name: str,
    max_tokens: int,
    api_key: str | None,
    *,
    spell: Spell,
    ask: Ask | None = None,
) -> None:
    """Refuse a completion budget `max_tokens` that leaves no room for a prompt where a server
    lists `name` with a `max_model_len` (prompt and completion together) at or below it: the
    server answers every such request with a 400, so every episode would fail. A server whose
    card has no `max_model_len`, or that does not answer, passes."""
    ask = _asker(ask, api_key, spell)
    for url in urls:
        try:
            cards = ask(url)
        except ValueError:
            continue
        for card in cards:
            if card.id != name or card.max_model_len is None or max_tokens < card.max_model_len:
                continue
            setting = spell("--max-tokens").removesuffix("=")
            given = f"{setting} {max_tokens}" if spell is as_flag else f"{setting}={max_tokens}"
            raise ValueError(
                f"{given} leaves no room for a prompt: the server at {_models_url(url)} serves "
                f"{name} with max_model_len {card.max_model_len} (prompt and completion "
                f"together), so it would refuse every request; pass {setting} below "
                f"{card.max_model_len} (the prompt's tokens count too), or serve a longer "
                "context: a model with a longer one, or, where the server's --max-model-len "
                "(`ludic serve`, vLLM) was set below the model's own, a higher one"
            )


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_served_model(
    server_url: ServerUrls,
    name: str,
    api_key: str | None = None,
    *,
    listed_by: str | None = None,
    spell: Spell = as_flag,
    ask: Ask | None = None,
) -> None:
    """Refuse a model name that a server's `/v1/models` does not list (else every request to it
    fails with a 404), naming the models it lists; several URLs: each one, as a `ServerPool`
    asks them all for `name`. `listed_by`: the server whose one model `name` is (no
    --served-model was given), checked against the others. Refused only where the server is
    known to route by model name (`ROUTES_BY_NAME`: `ludic serve`, vLLM); another (SGLang
    answers any name) gets one warning line and goes on. A server that wants an API key not
    given is refused (`ModelsUnauthorized`); one without `/v1/models`, one that lists nothing,
    or one that does not answer passes, and its first request says what is wrong. `spell`: how
    refusals name the settings (`as_argument` from Python); `ask`: how to ask a server."""
    from ludic.recipes.inference import server_urls

    urls = server_urls(server_url, spell=spell)  # a malformed URL is still refused
    ask = _asker(ask, api_key, spell)
    for url in urls:
        try:
            cards = ask(url)
        except ModelsUnauthorized:
            raise
        except ValueError:
            continue
        names = [card.id for card in cards]
        if not names or name in names:
            continue
        fix = _fix(names, several=len(urls) > 1 or listed_by is not None, spell=spell)
        problem = f"{_named(name, listed_by, spell)}: the server at {_models_url(url)} serves "
        problem += f"{', '.join(names)}, not {name}"
        owners = sorted({str(card.owned_by) for card in cards})
        if set(owners) <= ROUTES_BY_NAME:
            raise ValueError(f"{problem}; {fix}")
        _LOG.warning(
            "warning: %s; going on, as its models are owned_by %s, not ludic serve's or vLLM's, "
            "and such a server (SGLang) may answer any model name; if its requests fail with a "
            "404, %s",
            problem,
            ", ".join(owners),
            fix,
        )


def _named(name: str, listed_by: str | None, spell: Spell) -> str:
    """The model name checked: the one the caller gave, or the one `listed_by` lists."""
    if listed_by is None:
        return _given(spell, "--served-model", name)
    return (
        f"the model {name} (no {spell('--served-model')}: the one {_models_url(listed_by)} lists)"
    )


def _fix(names: list[str], *, several: bool, spell: Spell) -> str:
    """What to do when a server lists `names` but not the one asked (`several`: a pool,
    which asks every server for one name)."""
    served_model = spell("--served-model")
    if several:
        each = "every --server-url gets" if spell is as_flag else "the servers get"
        return (
            f"{each} the same model name: start them all serving one model, or pass "
            f"{served_model} with a name each of them lists"
        )
    if len(names) == 1:
        it = "the flag" if spell is as_flag else "it"
        return f"pass {_given(spell, '--served-model', names[0])} or leave {it} out"
    return f"pass {served_model} with one of them"


def served_models(
    server_url: str, api_key: str | None = None, *, spell: Spell = as_flag
) -> list[str]:
    """The model names an OpenAI-compatible server lists at `/v1/models` (`model_cards`)."""
    return [card.id for card in model_cards(server_url, api_key, spell=spell)]


def model_cards(
    server_url: str, api_key: str | None = None, *, spell: Spell = as_flag
) -> list[ModelCard]:
    """The models an OpenAI-compatible server lists at `/v1/models`, asked with `api_key` (what
    the client sends on inference requests); ValueError saying why when it cannot be asked
    (down, no such route, an answer that is no model list), `ModelsUnauthorized` for a 401 or
    403 naming the API-key setting as `spell` gives it."""
    import httpx

    url = _models_url(server_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=30)
        if response.status_code in (401, 403):
            raise ModelsUnauthorized(_unauthorized(url, response, api_key, spell))
        response.raise_for_status()
        return [
            ModelCard(
                id=str(card["id"]),
                owned_by=card.get("owned_by"),
                max_model_len=_positive_int(card.get("max_model_len")),
            )
            for card in response.json()["data"]
        ]
    except ModelsUnauthorized:
        raise
    except (httpx.HTTPError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(
            f"could not ask {url} which model it serves ({type(e).__name__}: {e}); is the "
            f"server up (`ludic serve --model DIR --port PORT`, or vLLM)? Or name the model "
            f"({spell('--served-model')})"
        ) from e


def _unauthorized(url: str, response: Any, api_key: str | None, spell: Spell) -> str:
    refused = (
        f"the server at {url} answers {response.status_code} {response.reason_phrase}: it wants "
        f"an API key on its OpenAI routes (vLLM --api-key)"
    )
    key = spell("--api-key")
    if api_key is None:  # nor would the inference requests: every episode would fail
        sender = "this command" if spell is as_flag else "the client"
        return (
            f"{refused} and got none: pass the server's key with {key} (without it {sender} "
            "sends none on its inference requests; a control token is not one)"
        )
    return f"{refused} and refused the one {key} gives: pass the server's key"


def _models_url(server_url: str) -> str:
    from ludic.inference.http.openai_client import check_server_url

    check_server_url(server_url)  # `localhost:8000` is no server that is down
    return server_url.rstrip("/").removesuffix("/v1") + "/v1/models"
