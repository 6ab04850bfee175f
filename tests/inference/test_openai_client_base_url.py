"""OpenAICompatibleClient refuses a server URL no request could reach when it is built, naming
the URL and the form to write, instead of retrying every request as if the server were down."""

from __future__ import annotations

import httpx
import pytest

from ludic.inference.http.openai_client import OpenAICompatibleClient


@pytest.mark.parametrize(
    "url",
    [
        "127.0.0.1:8000",
        "localhost:8000",
        "htp://127.0.0.1:8000",
        "http://127.0.0.1:99999",
        "http://",
    ],
)
def test_a_url_no_request_could_reach_is_refused_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match="http://HOST:PORT") as caught:
        OpenAICompatibleClient(url, model="m")
    assert repr(url) in str(caught.value)


def test_an_unparsable_url_is_refused_as_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a valid URL"):
        OpenAICompatibleClient("http://[::1:8000", model="m")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "https://example.org/v1", "HTTP://localhost:8000/"]
)
async def test_http_and_https_urls_are_accepted(url: str) -> None:
    mock = httpx.MockTransport(lambda request: httpx.Response(200))
    async with OpenAICompatibleClient(url, model="m", transport=mock) as client:
        assert await client.healthy()


def test_commands_refuse_such_a_url_before_asking_the_server_anything() -> None:
    """`--server-url localhost:8001` (train, eval, actor) is named as a malformed URL, not
    asked for its model and reported as a server that may be down."""
    from ludic.recipes.inference import served_model_name, server_urls

    with pytest.raises(ValueError, match="http://HOST:PORT"):
        server_urls(["http://127.0.0.1:8000", "localhost:8001"])
    with pytest.raises(ValueError, match="http://HOST:PORT") as caught:
        served_model_name("localhost:8001")
    assert "is the server up" not in str(caught.value)


async def test_an_endpoint_url_given_as_the_base_url_is_named_in_the_404() -> None:
    """`OpenAICompatibleClient("http://HOST:PORT/v1/chat/completions")` posts to
    `.../v1/chat/completions/v1/chat/completions`; the server's bare "Not Found" now names the
    URL asked for and the form to give. A 404 the server explains (a wrong model) is kept."""
    from ludic.inference import ChatRequest, SamplingConfig
    from ludic.inference.http.openai_client import InferenceRequestError

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "the model 'x' does not exist"}})
        return httpx.Response(404, json={"detail": "Not Found"})  # FastAPI's unknown route

    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingConfig())
    url = "http://127.0.0.1:8000/v1/chat/completions"
    async with OpenAICompatibleClient(url, model="m", transport=httpx.MockTransport(server)) as c:
        with pytest.raises(InferenceRequestError) as caught:
            await c.complete(request)
    message = caught.value.message
    assert f"no {url}/v1/chat/completions" in message and "http://HOST:PORT" in message
    base = "http://127.0.0.1:8000"
    async with OpenAICompatibleClient(base, model="x", transport=httpx.MockTransport(server)) as c:
        with pytest.raises(InferenceRequestError, match=r"the model 'x' does not exist$"):
            await c.complete(request)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1/"]
)
async def test_a_404_from_the_server_root_asks_whether_it_is_openai_compatible(url: str) -> None:
    """The base URL is already the server's root (or /v1): "give the base URL, not an
    endpoint's" would send the user after a mistake they did not make. The 404 says the server
    has no such route and asks whether it is an OpenAI-compatible server."""
    from ludic.inference import ChatRequest, SamplingConfig
    from ludic.inference.http.openai_client import InferenceRequestError

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingConfig())
    async with OpenAICompatibleClient(url, model="m", transport=httpx.MockTransport(server)) as c:
        with pytest.raises(InferenceRequestError) as caught:
            await c.complete(request)
    message = caught.value.message
    assert "has no route /v1/chat/completions" in message, message
    assert "OpenAI-compatible server" in message and "not an endpoint's" not in message
    assert "http://127.0.0.1:8000 " in message


async def test_a_base_url_with_a_path_beyond_v1_keeps_the_endpoint_advice() -> None:
    from ludic.inference import ChatRequest, SamplingConfig
    from ludic.inference.http.openai_client import InferenceRequestError

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingConfig())
    url = "http://127.0.0.1:8000/api"
    async with OpenAICompatibleClient(url, model="m", transport=httpx.MockTransport(server)) as c:
        with pytest.raises(InferenceRequestError, match="not an endpoint's") as caught:
            await c.complete(request)
    assert "OpenAI-compatible" not in caught.value.message
