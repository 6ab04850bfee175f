"""One inference server as a member of a `BroadcastPolicyPublisher` group: its bearer-token
control requests, where it sits in the group (first rank, number of ranks), its store channel,
and whether it is still there.

Every error names the server's URL, so a push to many servers says which one failed; a 4xx
(the server refused the request) raises `PushRefused`, a refusal that also says what to do,
and a control the server does not offer (`/ludic/weights/status`'s `controls`)
`ControlNotOffered`, before the server is asked to join. The group id the server answers
`/init` with travels on `/start`, `/finish`, `/close` and status requests, so the server can
tell this trainer that another one replaced its group (`replaced`, then `TrainerReplaced`).
It does no broadcasting and no verification (the publisher does both).
"""

from __future__ import annotations

from dataclasses import dataclass
from json import dumps
from typing import Any, Literal

import httpx

from ludic.distributed.control import StoreControl
from ludic.errors import Refusal

Control = Literal["http", "store"]
CONTROLS: tuple[Control, ...] = ("http", "store")
"""The controls this trainer can drive a push by (`ludic.distributed.control`: "store")."""

# How long a liveness check (between two slices of a wait for a reply) may take.
_ALIVE_TIMEOUT_S = 2.0


class WeightPushError(RuntimeError):
    """The server refused or failed a push (the message carries its explanation)."""


class ServerUnreachable(WeightPushError):
    """The server could not be reached, or failed the request itself (5xx): it may be down."""


class TrainerReplaced(Refusal, WeightPushError):
    """Another trainer joined a server and replaced this trainer's group there: the server
    serves that trainer's weights now. Not retried (unless the publisher may `take_over`). A
    refusal: `ludic train` ends with its message (who joined, what to do), no traceback."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Refused:
    """One server's refusal: its URL, the request refused, the HTTP status, its own words."""

    url: str
    what: str
    status: int | None
    said: str


class PushRefused(Refusal, WeightPushError):
    """A server answered a weight-sync request with a 4xx: it refused it (a wrong token, a
    model of another shape, a request it cannot take). Not retried. A refusal: `ludic train`
    and `ludic learner` end with its message (each server's URL, the HTTP status, the server's
    own words, what to do), no traceback; a WeightPushError for callers that catch one."""

    def __init__(self, refusals: list[Refused]) -> None:
        said = "; ".join(
            f"server {r.url}: {r.what} refused ({r.status}): {r.said}" for r in refusals
        )
        fixes = dict.fromkeys(_what_to_do(r.status, r.said) for r in refusals)
        super().__init__(f"{said}. {' '.join(fixes)}")
        self.refusals = refusals
        self.said = said  # what happened, without the advice (for errors that say another fix)

    def __reduce__(self) -> tuple[type[PushRefused], tuple[list[Refused]]]:
        return PushRefused, (self.refusals,)  # pickled whole (sent between ranks, processes)


class ControlNotOffered(Refusal, WeightPushError):
    """A server does not offer the control the trainer asked for (`BroadcastPolicyPublisher(
    control=...)`; vLLM's extension offers "http" only), or, with "auto", offers none this
    trainer drives (another Ludic version). Raised before the server is asked to join. A
    refusal: `ludic train` and `ludic learner` end with its message (the server's URL, what it
    offers, what to do), no traceback; a WeightPushError for callers that catch one."""


class TooFewServers(Refusal, WeightPushError):
    """Fewer servers than `min_servers` could be reached or take a push (each gone one named
    with why). A refusal: `ludic learner` and `ludic train` end with its message (each URL, why,
    what to do), no traceback; a WeightPushError for callers that catch one."""


# What the server's refusal says (`ludic.inference.http.weight_tenure.REPLACED`).
REPLACED = "replaced by another trainer"


class ServerLink:
    """The server at `url` (its control endpoints take bearer `token`), `ranks` ranks wide in
    the group (vLLM with tensor parallelism: TP). `http` replaces the client (tests)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        ranks: int = 1,
        timeout_s: float = 120.0,
        http: httpx.Client | None = None,
    ) -> None:
        if ranks < 1:
            raise ValueError(f"server_ranks must be >= 1, got {ranks}")
        self.url = url.rstrip("/").removesuffix("/v1")  # the OpenAI base URL works too
        self.ranks = ranks
        self.http = http or httpx.Client(base_url=self.url, timeout=timeout_s)
        self.http.headers["Authorization"] = f"Bearer {token}"
        self.first_rank = 0  # set when the group is built (0: not in a group)
        self.store_at: str | None = None  # "host:port" of the trainer store it was asked to join
        self.control: Control = "http"
        self.channel: StoreControl | None = None
        self.served_dtype: str | None = None  # from its status: sets the probe atol
        self.pieces = False  # its status says it receives buckets in pieces (`piece_bytes`)
        self.group: str | None = None  # the id of the group it joined (from its /init reply)
        self.trainer: dict[str, Any] | None = None  # who this trainer is, sent with /init
        self.replaced: str | None = None  # why it refuses this trainer: another replaced it

    def status(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """`GET /ludic/weights/status` (fails fast on a bad URL or token); asks whether the
        group this trainer joined was replaced (`replaced`)."""
        path = "/ludic/weights/status" + ("" if self.group is None else f"?group={self.group}")
        status = self.request("GET", path, timeout_s=timeout_s)
        if self.group is not None and status.get("replaced_by"):
            self.replaced = str(status["replaced_by"])
        self.served_dtype = status.get("dtype")
        self.pieces = status.get("pieces") is True  # absent on an older server: whole buckets
        return status

    def join(
        self,
        *,
        host: str,
        port: int,
        backend: str,
        world_size: int,
        first_rank: int,
        timeout_s: float,
        control: Literal["auto", "http", "store"],
        offered: list[str],
    ) -> None:
        """Ask the server to join the group on the trainer's store as ranks `first_rank`..."""
        chosen = self.control_for(control, offered)
        body: dict[str, Any] = {
            "host": host,
            "port": port,
            "backend": backend,
            "world_size": world_size,
            "timeout_s": timeout_s,
        }
        if first_rank != 1:  # sent only then: a single server sees the request as before
            body["rank"] = first_rank
        if chosen == "store":  # likewise: HTTP-driven servers see the request as before
            body["control"] = "store"
        if self.trainer is not None:
            body["trainer"] = self.trainer
        reply = self.request("POST", "/ludic/weights/init", json=body)
        self.first_rank, self.control = first_rank, chosen
        self.store_at = f"{host}:{port}"
        group = reply.get("group")  # absent from servers that do not mint one (older ones)
        self.group = None if group is None else str(group)
        self.replaced = None

    def control_for(self, control: Literal["auto", "http", "store"], offered: list[str]) -> Control:
        """The control to ask this server for: `control`, or for "auto" "store" where the
        server offers it, else "http". `ControlNotOffered`, before any request, when the server
        does not offer it (for "auto": offers neither)."""
        if control != "auto":
            if control in offered:
                return control
            raise ControlNotOffered(
                f"server {self.url} drives weight pushes by control {offered} only, not "
                f"{control!r} (BroadcastPolicyPublisher(control={control!r})); the vLLM "
                "extension offers 'http' only, `ludic serve` both. Pass control='auto' (each "
                "server's own: 'store' where offered, else 'http'), or point the trainer at a "
                f"server that offers {control!r}"
            )
        chosen: Control = "store" if "store" in offered else "http"
        if chosen in offered:
            return chosen
        raise ControlNotOffered(
            f"server {self.url} drives weight pushes by control {offered} only, none of which "
            f"this trainer drives ({list(CONTROLS)}): the server runs another Ludic version. "
            "Install the same Ludic version on the trainer and the server"
        )

    def why_gone(self) -> str | None:
        """Why the server cannot take part in the push now (None: it is there and joined)."""
        try:
            status = self.status(timeout_s=_ALIVE_TIMEOUT_S)
        except WeightPushError as e:
            return str(e)
        if self.replaced is not None:
            return f"server {self.url}: {self.replaced}"
        held = status.get("store")  # absent on servers that do not say (vLLM)
        if held and self.store_at and held != self.store_at:
            return (
                f"server {self.url} is in another trainer's weight-sync group now (store at "
                f"{held}, not this trainer's {self.store_at}): it joined and replaced this one"
            )
        if status.get("join_error"):
            return f"server {self.url} could not join the group: {status['join_error']}"
        if not status.get("connected") and not status.get("joining"):
            why = status.get("last_error")
            return f"server {self.url} is not in the weight-sync group " + (
                f"(its receive failed: {why})" if why else "(it restarted, or left it)"
            )
        return None

    def leave(self) -> None:
        self.first_rank, self.channel, self.store_at = 0, None, None
        self.group = None

    def scoped(self, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """`body` with this trainer's group id (the server refuses a request for a group it
        no longer holds), when the server gave one."""
        return {**(body or {}), **({} if self.group is None else {"group": self.group})}

    def refused_as_replaced(self, error: BaseException) -> bool:
        """Whether `error` is this server saying another trainer replaced this one (noted)."""
        if REPLACED not in str(error):
            return False
        # the server's own words (who replaced it, what to do): no URL, no refusal's advice
        said = error.refusals if isinstance(error, PushRefused) else []
        words = "; ".join(r.said for r in said if r.url == self.url) or str(error)
        self.replaced = self.replaced or words
        return True

    def request(
        self, method: str, path: str, json: Any = None, *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        try:
            response = self.http.request(method, path, json=json, **extra)
        except httpx.HTTPError as e:
            down = (
                " (nothing listens there: the server is not running; one that served before "
                "has exited, and its own log says why, e.g. vLLM's EngineDeadError)"
                if isinstance(e, httpx.ConnectError)
                else ""
            )
            raise ServerUnreachable(
                f"server {self.url}: {method} {path}: cannot reach the server: {e}{down}"
            ) from e
        status = response.status_code
        if 400 <= status < 500:
            said = _server_said(response)
            raise PushRefused(
                [Refused(url=self.url, what=f"{method} {path}", status=status, said=said)]
            )
        if status != 200:
            error = ServerUnreachable if status >= 500 else WeightPushError
            raise error(
                f"server {self.url}: {method} {path} failed ({status}): {_server_said(response)}"
            )
        body: dict[str, Any] = response.json()
        return body


# How much of a reply that is not a JSON error (a proxy's HTML page, a traceback) to quote.
_FOREIGN_CHARS = 500


def _server_said(response: httpx.Response) -> str:
    """The explanation in an error reply: the whole message of a JSON error as Ludic's
    server, vLLM and FastAPI send them (a refusal that says what to do is never cut), else the
    body's first `_FOREIGN_CHARS` characters, saying so when the rest was cut."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("error", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
        if "detail" in body:  # FastAPI's own: a string, or a list of validation problems
            detail = body["detail"]
            return detail if isinstance(detail, str) else dumps(detail)
    text = response.text
    if len(text) <= _FOREIGN_CHARS:
        return text
    return (
        f"{text[:_FOREIGN_CHARS]}... [cut: {len(text) - _FOREIGN_CHARS} more characters of a "
        "reply that is not a JSON error, so likely not from a Ludic or vLLM server (a proxy?)]"
    )


# What a refusal's text says when the server's model is not the trainer's (`ludic.distributed.
# manifest.check_against`, which the embedded server and the vLLM extension both run).
_OTHER_MODEL = ("shape mismatch", "does not have", "a full push misses")
# Their hint, in both servers' words (lower-cased): then the fix is not said a second time.
_SAME_MODEL_HINT = "start the trainer from the model the server loaded"


def _what_to_do(status: int | None, said: str) -> str:
    """The fix for a server's refusal of a weight-sync request (HTTP `status`, its words)."""
    if status == 401:
        return (
            "The server refused the trainer's token: give the trainer the token the server was "
            "started with (`ludic serve --token T`; vLLM's `python -m ludic.inference.vllm."
            "server ... --ludic-token T`; or $LUDIC_SERVER_TOKEN where the server started): "
            "`ludic train --server-token`, `ludic learner --token`, or "
            "BroadcastPolicyPublisher's token"
        )
    if status == 403:
        return (
            "The server was started without a token, so it takes no weights: restart it with "
            "one (`ludic serve --token T`; vLLM's `python -m ludic.inference.vllm.server ... "
            "--ludic-token T`; or $LUDIC_SERVER_TOKEN set) and give the trainer the same"
        )
    if status == 404:
        return (
            "The server has no Ludic weight-sync endpoints: point the trainer at `ludic serve` "
            "or at vLLM with Ludic's extension, by the server's own URL (not a proxy's)"
        )
    if any(marker in said for marker in _OTHER_MODEL):
        if _SAME_MODEL_HINT in said.lower():  # the server's words already say how
            return (
                "The server serves another model than the trainer's (another architecture or size)"
            )
        return (
            "The server serves another model than the trainer's (another architecture or "
            "size): start both from the same model directory"
        )
    return (
        "A refusal is not retried: fix what the server names (a trainer and a server on "
        "different Ludic versions refuse each other's requests: install the same on both), "
        "then rerun; a run that saved checkpoints resumes from its last one"
    )
