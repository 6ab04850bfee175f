"""The embedded engine behind an OpenAI-compatible HTTP server (FastAPI + uvicorn).

Endpoints: `/v1/chat/completions`, token-in `/v1/completions`, `/v1/models`, `/health` (503 when
the engine's worker is not running), and bearer-token control endpoints under `/ludic/`:
version, logprob probe, weight update from safetensors bytes, and the torch.distributed weight
receiver `/ludic/weights/*` (`ludic.inference.http.weight_receiver`, driven by
`ludic.distributed.BroadcastPolicyPublisher`). Both completion endpoints stream with
`stream=true` (server-sent events, as vLLM and OpenAI send them). Binds 127.0.0.1 by default.
Request bodies are capped (413 beyond `max_body_bytes`; the weight upload is exempt), JSON ones
also by their count of values, before parsing (`json_body`), and prompts
are tokenized off the event loop (a text far over the context only by its head), so one huge
request cannot stall `/health` or other requests; `serve` closes connections whose request head
or body does not arrive in time (`read_deadlines`). A client that disconnects cancels its request,
streamed or not. It does not batch several choices per request or serve more than one model.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from safetensors.torch import load as load_safetensors
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.embedded.engine import CompletionStream, EmbeddedEngine
from ludic.inference.embedded.prompts import encode_prompt_text
from ludic.inference.embedded.streaming import TextStream
from ludic.inference.http.auth import token_matches
from ludic.inference.http.json_body import DuplicateKey, JSONBound, TooDeep, json_route_class
from ludic.inference.http.openai_client import VERSION_HEADER
from ludic.inference.http.openai_protocol import (
    ChatCompletionRequest,
    ChunkWriter,
    CompletionRequest,
    chat_completion_body,
    completion_body,
    error_body,
)
from ludic.inference.http.serve_config import ServeConfig
from ludic.inference.http.serve_shutdown import stop_at_first_signal
from ludic.inference.http.weight_routes import install_weight_sync_routes

T = TypeVar("T")
CLIENT_GONE = 499  # nginx's status for a request whose client closed the connection first
DEFAULT_MAX_BODY_BYTES = 8 * 2**20
UNCAPPED_PATHS = frozenset({"/ludic/update_weights"})  # a whole model's weights, token-guarded


class ProbeRequest(BaseModel):
    token_ids: list[int]


def create_app(
    engine: EmbeddedEngine,
    *,
    model_name: str,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    close_engine_at_signal: bool = False,
) -> FastAPI:
    """The FastAPI app serving `engine` (the caller owns and closes the engine; with
    `close_engine_at_signal`, the first SIGINT or SIGTERM while the app runs in the main thread
    also closes it, so requests in flight end at once rather than at their last token)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        on_signal = stop_at_first_signal(engine.close) if close_engine_at_signal else None
        with on_signal or contextlib.nullcontext():
            yield
        app.state.weight_receiver.close()  # ends a store-driven listener thread

    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    app = FastAPI(title="ludic embedded inference server", lifespan=lifespan)
    app.router.route_class = json_route_class(
        JSONBound.for_context(engine.max_model_len, engine.model_len)
    )
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)
    bearer = HTTPBearer(auto_error=False)

    def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is None:
            raise HTTPException(
                403, "control endpoints are disabled: start the server with a token"
            )
        if credentials is None or not token_matches(credentials.credentials, token):
            raise HTTPException(401, "missing or wrong bearer token for a control endpoint")

    app.add_middleware(_VersionHeader, engine=engine)

    @app.exception_handler(RequestValidationError)
    async def _invalid(http: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, _invalid_message(http, exc)), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        detail = _unparsable_body(exc) or str(exc.detail)
        return JSONResponse(error_body(exc.status_code, detail), status_code=exc.status_code)

    async def generate(
        http: Request,
        request: ChatRequest,
        req: ChatCompletionRequest | CompletionRequest,
        body: Callable[[ChatResponse], dict[str, Any]],
    ) -> Response:
        problem = req.unsupported()
        if problem is not None:
            raise HTTPException(400, problem)
        if req.model not in (None, model_name):
            raise HTTPException(
                404,
                f"the model {req.model!r} does not exist: this server serves {model_name!r} "
                f"(GET /v1/models lists it); send model={model_name!r}, or start `ludic serve` "
                f"with --served-model-name {req.model}",
            )
        try:
            if req.stream:  # validated and queued now: a bad request is a 400, not a stream
                deltas = await engine.open_stream(request)
                writer = ChunkWriter(req, model_name, engine.tokenizer)
                return _ClosingStream(_events(deltas, writer, request), deltas)
            reply = await _unless_the_client_leaves(http, engine.complete(request))
            content = body(reply)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        except RuntimeError as e:
            raise HTTPException(_failure_status(e), str(e)) from e
        # The same bytes FastAPI would send for the dict, without its jsonable_encoder walk over
        # every logprob (~2 ms of CPU for a 64-token completion); outside the try: a NaN is a 500
        return JSONResponse(content, headers=_version_header(reply))

    async def _events(
        deltas: CompletionStream, writer: ChunkWriter, request: ChatRequest
    ) -> AsyncIterator[str]:
        text = TextStream(engine.codec, request.sampling.stop)
        ids: list[int] = []
        try:
            async for delta in deltas:
                ids += delta.token_ids
                r = delta.response
                yield writer.delta(text.push(ids) if r is None else text.finish(r.text), delta)
                if r is not None and writer.req.include_usage:
                    yield writer.usage(r)
        except RuntimeError as e:  # the engine failed the request mid-stream
            yield writer.error(_failure_status(e), str(e))
        yield writer.done()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatCompletionRequest, http: Request) -> Response:
        chat = _sampling_errors_as_400(lambda: req.to_chat_request(engine.max_model_len))
        return await generate(
            http, chat, req, lambda r: chat_completion_body(r, req, model_name, engine.tokenizer)
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest, http: Request) -> Response:
        sampling = _sampling_errors_as_400(lambda: req.sampling(engine.max_model_len))
        if isinstance(req.prompt, list):
            ids = req.prompt
        else:  # off the event loop: a long text must not stall other requests
            encode = functools.partial(
                encode_prompt_text,
                engine.tokenizer,
                req.prompt,
                engine.max_model_len,
                where="prompt",
                add_special_tokens=True,  # a BOS, as vLLM and tokenizer.encode(prompt) add
                model_len=engine.model_len,
            )
            ids = await asyncio.to_thread(_sampling_errors_as_400, encode)
        chat = ChatRequest(messages=[], sampling=sampling, prompt_token_ids=list(ids))
        return await generate(
            http, chat, req, lambda r: completion_body(r, req, model_name, engine.tokenizer)
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "owned_by": "ludic",
            "max_model_len": engine.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> JSONResponse:
        status = engine.status()
        body = {"status": "ok" if status.running else "unavailable", **status.to_dict()}
        return JSONResponse(body, status_code=200 if status.running else 503)

    @app.get("/ludic/version", dependencies=[Depends(require_token)])
    async def version() -> dict[str, int]:
        return {"policy_version": engine.policy_version}

    @app.post("/ludic/logprobs", dependencies=[Depends(require_token)])
    async def logprobs(req: ProbeRequest) -> dict[str, Any]:
        try:
            values = await asyncio.to_thread(engine.logprobs, req.token_ids)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        return {"logprobs": values, "policy_version": engine.policy_version}

    @app.post("/ludic/update_weights", dependencies=[Depends(require_token)])
    async def update_weights(
        request: Request, version: int | None = None, strict: bool = True
    ) -> dict[str, int]:
        """Body: a safetensors file (bytes) with the new weights. Never unpickled."""
        payload = await request.body()
        try:
            state = load_safetensors(payload)
        except Exception as e:
            raise HTTPException(400, f"body is not a safetensors file: {e}") from e
        try:
            new_version = await asyncio.to_thread(
                engine.update_weights, state, version=version, strict=strict
            )
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        return {"policy_version": new_version}

    app.state.weight_receiver = install_weight_sync_routes(app, engine, token)
    return app


def _version_header(reply: ChatResponse) -> dict[str, str]:
    """The version header of a non-streamed completion: its body's `policy_version` (its first
    token's), not the engine's version when the reply is sent, which a weight push that landed
    during or after generation makes newer than the tokens."""
    return {} if reply.policy_version is None else {VERSION_HEADER: str(reply.policy_version)}


class _VersionHeader:
    """Puts the engine's policy version in the headers of every reply that has none as the
    reply starts (plain ASGI: starlette's `@app.middleware("http")` costs ~1 ms of CPU per
    request). A non-streamed completion carries its body's version (`_version_header`); a
    stream's headers go out once its request is queued, before its first token, so a push that
    lands in between makes the header older than the tokens (never newer): its last chunk's
    `policy_version` and `policy_version_end` name the versions its tokens were sampled under."""

    def __init__(self, app: ASGIApp, engine: EmbeddedEngine) -> None:
        self.app, self.engine = app, engine
        self.name = VERSION_HEADER.lower().encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_version(message: Message) -> None:
            headers = message.get("headers", ())
            if message["type"] == "http.response.start" and all(
                name.lower() != self.name for name, _ in headers
            ):
                version = str(self.engine.policy_version).encode("latin-1")
                message = {**message, "headers": [*headers, (self.name, version)]}
            await send(message)

        await self.app(scope, receive, with_version)


class _BodyLimit:
    """Refuses (413) a request body over `max_bytes`, by its Content-Length before reading it or
    as it arrives, so nothing parses or tokenizes an oversized body. Paths in `UNCAPPED_PATHS`
    are exempt."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCAPPED_PATHS:
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # a body sent without (or beyond) its length
                raise HTTPException(413, self.message)
            return message

        await self.app(scope, counted, send)

    @property
    def message(self) -> str:
        return (
            f"request body over {self.max_bytes} bytes; raise the server's --max-body-bytes "
            "if requests this large are expected"
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(error_body(413, self.message), status_code=413)
        await response(scope, receive, send)


class _ClosingStream(StreamingResponse):
    """Server-sent events that close the request's stream however the response ends, so a
    client that goes away cancels its request, even before the first chunk was sent."""

    def __init__(self, events: AsyncIterator[str], deltas: CompletionStream) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.deltas = deltas

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.deltas.aclose()


async def _unless_the_client_leaves(http: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or its cancellation (and a 499 nobody reads) once the client has
    disconnected: a reply nobody waits for is not worth generating, and a client that timed out
    and resent would otherwise have the server generate both."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise HTTPException(CLIENT_GONE, "the client disconnected; its request was cancelled")
    return task.result()


async def _disconnected(http: Request) -> None:
    """Returns when the client has gone (the body is read: what arrives next is the end)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def _invalid_message(http: Request, exc: RequestValidationError) -> str:
    """What is wrong with a request FastAPI could not validate, and the fix: a body that is
    not JSON or not sent as JSON is named as such, not as a field error at 'body.28'."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        error = errors[0]
        reason = (error.get("ctx") or {}).get("error", error["msg"])
        return (
            f"the body is not valid JSON ({reason} at character {error['loc'][-1]}); send one "
            "JSON object"
        )
    content_type = http.headers.get("content-type")
    if content_type and not _is_json(content_type) and any(e["loc"] == ("body",) for e in errors):
        return (
            f"the body was sent as Content-Type {content_type!r}, which this endpoint does not "
            "read: send it as JSON with Content-Type: application/json"
        )
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
    return f"invalid request: {problems}"


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _unparsable_body(exc: HTTPException) -> str | None:
    """FastAPI's 'There was an error parsing the body' said neither what nor the fix: a body
    that is not UTF-8, JSON nested past the parser's recursion limit or `MAX_JSON_DEPTH`, or a
    key given twice."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        bad = cause.object[cause.start : cause.start + 1]
        return (
            f"the body is not UTF-8 (byte 0x{bad.hex()} at position {cause.start}); send JSON "
            "encoded as UTF-8 (\\u escapes for other characters)"
        )
    if isinstance(cause, RecursionError):
        return "the body's JSON nests too deep to parse; send a flatter JSON object"
    if isinstance(cause, (DuplicateKey, TooDeep)):
        return str(cause)
    return None


def _failure_status(error: RuntimeError) -> int:
    """503 for a request the closed engine could not serve, 500 for one that failed."""
    return 503 if "closed" in str(error) else 500


def _sampling_errors_as_400(build: Any) -> Any:
    try:
        return build()
    except ValueError as e:
        raise HTTPException(400, str(e)) from e


def serve(config: ServeConfig) -> None:
    """Load the model, start the engine and serve until interrupted (blocks; `serve_run`)."""
    from ludic.inference.http.serve_run import run_server  # it imports this module's app

    run_server(config)


if __name__ == "__main__":
    import tyro

    serve(tyro.cli(ServeConfig))
