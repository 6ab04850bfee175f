"""OpenAICompatibleClient: a ChatClient over HTTP for the embedded server, vLLM and SGLang.

It asks for token ids (`return_token_ids`) and sampled-token logprobs, uses `/v1/completions`
with a token-id prompt in token-in mode, retries connection errors, 429 and 5xx with exponential
backoff, and turns another 4xx into `InferenceRequestError` carrying the server's message. It
never resends a request the server may still be generating: a read timeout is
`InferenceTimeoutError` at once (a `ServerPool` moves that call to another server once; the
timed-out connection is closed, and `ludic serve` cancels a request whose client went away).
Text with a lone surrogate is refused before sending. It does not stream and sends n=1 only.
Servers that return no ids give responses with empty ids (no token trace); mismatched ids and
logprobs are an error, and so is a reply that is not JSON or holds a value of the wrong kind
(`InferenceResponseError` naming it: the episode fails, nothing is trained on it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from typing import Any

import httpx

from ludic.errors import Refusal
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.http.aiohttp_transport import AiohttpTransport
from ludic.inference.sampling import resolve_sampling_args
from ludic.inference.unicode_check import check_text
from ludic.types import ToolCall

# Servers that cannot put the policy version in the body (vLLM) send it as a header.
VERSION_HEADER = "X-Ludic-Policy-Version"


class InferenceRequestError(ValueError):
    """The server refused the request (4xx). `message` is the server's own explanation."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"inference server refused the request ({status_code}): {message}")
        self.status_code = status_code
        self.message = message


class InferenceResponseError(ValueError):
    """The server answered, but not with a well-formed OpenAI-compatible completion: not JSON,
    a field missing, or a value of the wrong kind (a token id that is no int >= 0, a logprob
    that is not finite, a policy version that is no int >= 0). Never retried (the server
    would answer alike); the episode fails with this message rather than training on it."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(
            f"{where} answered with a malformed reply ({problem}); is it an OpenAI-compatible "
            "server (ludic serve, or vLLM with return_token_ids) at that address?"
        )


class InferenceUnavailableError(Refusal, ConnectionError):
    """The server could not be reached, or kept failing (5xx), after all retries."""


class InferenceTimeoutError(TimeoutError):
    """The server sent no reply within the client's read timeout. Never retried: the server may
    still be generating the reply, and a resend would generate it again. A `ServerPool` marks
    the server down and sends the call once to another server."""


class OpenAICompatibleClient:
    """ChatClient against an OpenAI-compatible server (`base_url`, with or without `/v1`).

    Wraps one `httpx.AsyncClient`: use a client in one event loop at a time (used again from a
    new loop, e.g. a second `asyncio.run`, it opens new connections) and `aclose()` it.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 5,
        *,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        check_server_url(base_url)
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport or AiohttpTransport(),
        )

    async def complete(self, request: ChatRequest) -> ChatResponse:
        if request.prompt_token_ids is not None:
            path, parse = "/v1/completions", _parse_completion
            body, headers = await self._post(path, self._completion_body(request))
        else:
            path, parse = "/v1/chat/completions", _parse_chat
            body, headers = await self._post(path, self._chat_body(request))
        where = f"the server at {self.base_url}{path}"
        try:
            response = parse(body)
            if response.policy_version is None and VERSION_HEADER in headers:
                version = int(headers[VERSION_HEADER])
                response = dataclasses.replace(response, policy_version=version)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise InferenceResponseError(where, f"{type(e).__name__}: {e}") from e
        _check_reply(response, where)
        return response

    def _sampling_fields(self, request: ChatRequest) -> dict[str, Any]:
        kwargs = resolve_sampling_args(request.sampling)
        extra = kwargs.pop("extra_body", {})
        body = {"model": self.model, **kwargs, **extra, "return_token_ids": True}
        if "max_think" in extra:  # vLLM passes per-request args to logits processors this way
            body["vllm_xargs"] = {"max_think": extra["max_think"]}
        return body

    def _chat_body(self, request: ChatRequest) -> dict[str, Any]:
        body = {**self._sampling_fields(request), "messages": list(request.messages)}
        body["logprobs"] = True
        if request.tools:
            body["tools"] = list(request.tools)
        return body

    def _completion_body(self, request: ChatRequest) -> dict[str, Any]:
        assert request.prompt_token_ids is not None
        body = {**self._sampling_fields(request), "prompt": list(request.prompt_token_ids)}
        body["logprobs"] = 0  # the sampled token's logprob, no alternatives
        return body

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], httpx.Headers]:
        last_problem = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
            try:
                response = await self._http.post(path, json=body)
            except UnicodeEncodeError:  # a lone surrogate: say where
                for field, value in body.items():
                    check_text(value, field)
                raise
            except httpx.ReadTimeout as e:
                raise self._timed_out(path) from e
            except httpx.TransportError as e:  # not sent, or the connection was lost
                last_problem = f"{type(e).__name__}: {e}"
                continue
            if response.status_code >= 500 or response.status_code == 429:
                last_problem = f"{response.status_code}: {_server_message(response)}"
                continue
            if response.status_code >= 400:
                message = _server_message(response)
                if response.status_code == 404 and message == "Not Found":  # no such route
                    message = self._no_route(path)
                raise InferenceRequestError(response.status_code, message)
            try:
                result = response.json()
            except ValueError:
                result = None
            if not isinstance(result, dict):
                raise InferenceResponseError(
                    f"the server at {self.base_url}{path}",
                    f"a {response.status_code} whose body is not a JSON object: "
                    f"{response.text[:200]!r}",
                )
            return result, response.headers
        raise InferenceUnavailableError(
            f"{self.base_url}{path} failed after {self.max_retries + 1} attempts: {last_problem}"
        )

    def _no_route(self, path: str) -> str:
        """A bare 404 "Not Found": the URL is wrong when base_url has a path beyond the server's
        root (or /v1), else the server itself lacks the route."""
        if httpx.URL(self.base_url).path not in ("", "/"):
            return (
                f"Not Found: the server has no {self.base_url}{path}; give the client the "
                "server's base URL (http://HOST:PORT, with or without /v1), not an endpoint's"
            )
        return (
            f"Not Found: the server at {self.base_url} has no route {path}; is it an "
            "OpenAI-compatible server (ludic serve, vLLM) listening at that address?"
        )

    def _timed_out(self, path: str) -> InferenceTimeoutError:
        return InferenceTimeoutError(
            f"{self.base_url}{path} sent no reply within the client's read timeout of "
            f"{self._http.timeout.read} s; not resent, since the server may still be generating "
            "it and a resend would generate it twice. Raise OpenAICompatibleClient(timeout=...) "
            "(ServerPool.from_urls(timeout_s=...)) for generations this long, or lower max_tokens"
        )

    async def answers(self, timeout: float) -> str | None:
        """Whether the server answers a real, cheap request (a one-token completion) within
        `timeout` seconds: None if it does (any reply but a 5xx), else why not. A hung server
        can still answer `GET /health`; this goes through its engine. No retries."""
        body = {"model": self.model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
        try:
            response = await self._http.post("/v1/completions", json=body, timeout=timeout)
        except httpx.TimeoutException:
            return f"no reply to a one-token completion within {timeout:g} s"
        except httpx.HTTPError as e:
            return f"a one-token completion failed: {type(e).__name__}: {e}"
        if response.status_code >= 500:
            return f"a one-token completion failed ({response.status_code})"
        return None

    async def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the server answers `GET /health` with 200 (no retries)."""
        try:
            response = await self._http.get("/health", timeout=timeout)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> OpenAICompatibleClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def check_server_url(base_url: str) -> None:
    """Refuse a server URL no request could reach (no http(s) scheme, no host, a port out of
    range) here: sent, it would fail every attempt with a transport error and be retried as if
    the server were down."""
    try:
        url = httpx.URL(base_url)
        port_ok = url.port is None or 0 < url.port < 65536
    except httpx.InvalidURL as e:
        raise ValueError(f"server URL {base_url!r} is not a valid URL ({e})") from None
    if url.scheme not in ("http", "https") or not url.host or not port_ok:
        raise ValueError(
            f"server URL {base_url!r} is not an http(s) URL with a host and a port in 1..65535: "
            "write it as http://HOST:PORT, e.g. http://127.0.0.1:8000"
        )


def _server_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:500]


def _checked(
    ids: list[int] | None, logprobs: list[float] | None
) -> tuple[tuple[int, ...], tuple[float, ...] | None]:
    if ids is None:
        return (), None
    if logprobs is not None and len(logprobs) != len(ids):
        raise ValueError(
            f"server returned {len(ids)} token ids but {len(logprobs)} logprobs; token-in/out "
            "training needs one logprob per token"
        )
    return tuple(ids), None if logprobs is None else tuple(logprobs)


def _parse_chat(body: dict[str, Any]) -> ChatResponse:
    choice = body["choices"][0]
    message = choice.get("message") or {}
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = None if content is None else [float(c["logprob"]) for c in content]
    completion_ids, completion_logprobs = _checked(choice.get("token_ids"), logprobs)
    calls = tuple(
        ToolCall(
            id=c.get("id", ""), name=c["function"]["name"], arguments=c["function"]["arguments"]
        )
        for c in message.get("tool_calls") or ()
    )
    return ChatResponse(
        text=message.get("content") or "",
        prompt_token_ids=tuple(body.get("prompt_token_ids") or ()),
        completion_token_ids=completion_ids,
        completion_logprobs=completion_logprobs,
        finish_reason=choice.get("finish_reason"),
        policy_version=body.get("policy_version"),
        tool_calls=calls,
        extra=_reply_extra(body, choice),
    )


def _parse_completion(body: dict[str, Any]) -> ChatResponse:
    choice = body["choices"][0]
    token_logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    logprobs = None if token_logprobs is None else [float(x) for x in token_logprobs]
    completion_ids, completion_logprobs = _checked(choice.get("token_ids"), logprobs)
    return ChatResponse(
        text=choice.get("text") or "",
        prompt_token_ids=tuple(
            choice.get("prompt_token_ids") or body.get("prompt_token_ids") or ()
        ),
        completion_token_ids=completion_ids,
        completion_logprobs=completion_logprobs,
        finish_reason=choice.get("finish_reason"),
        policy_version=body.get("policy_version"),
        extra=_reply_extra(body, choice),
    )


def _check_reply(r: ChatResponse, where: str) -> None:
    """InferenceResponseError naming the first value of the wrong kind in a parsed reply."""
    if not isinstance(r.text, str):
        raise InferenceResponseError(where, f"its text is a {type(r.text).__name__}, not a string")
    for name, ids in (("prompt", r.prompt_token_ids), ("completion", r.completion_token_ids)):
        for token in ids:
            if not _is_token_id(token):
                problem = f"its {name} token ids hold {token!r:.50}, not an int >= 0"
                raise InferenceResponseError(where, problem)
    if not all(math.isfinite(lp) for lp in r.completion_logprobs or ()):
        raise InferenceResponseError(where, "a sampled token's logprob is nan or inf")
    for name, version in (("", r.policy_version), (" end", r.extra.get("policy_version_end"))):
        if version is not None and not _is_token_id(version):
            problem = f"its policy version{name} is {version!r:.50}, not an int >= 0"
            raise InferenceResponseError(where, problem)


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _reply_extra(body: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """`stop_reason`, and `policy_version_end` where a weight push landed mid-reply (`ludic
    serve` sends it always; kept only where it differs, as the embedded engine does)."""
    extra: dict[str, Any] = {}
    if choice.get("stop_reason") is not None:
        extra["stop_reason"] = choice["stop_reason"]
    end = body.get("policy_version_end")
    if end is not None and end != body.get("policy_version"):
        extra["policy_version_end"] = end
    return extra
