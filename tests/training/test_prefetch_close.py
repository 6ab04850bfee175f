"""PrefetchBatchSource.close(client): a client the rollouts used on the prefetch loop is closed
on that loop (an HTTP client's connections belong to it), after the draw in flight is cancelled;
an object it cannot close is refused before anything stops."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from training_fakes import item

from ludic.training import PrefetchBatchSource, SAWBatch


class LoopRecordingClient:
    def __init__(self) -> None:
        self.used_on: set[asyncio.AbstractEventLoop] = set()
        self.closed_on: asyncio.AbstractEventLoop | None = None

    async def aclose(self) -> None:
        self.closed_on = asyncio.get_running_loop()


class ClientSource:
    """Each batch "generates" with `client` on whatever loop draws it."""

    def __init__(self, client: LoopRecordingClient) -> None:
        self.client = client

    async def next_batch(self) -> SAWBatch:
        self.client.used_on.add(asyncio.get_running_loop())
        return SAWBatch(items=[item(3, index=0)])


def test_the_client_is_closed_on_the_loop_that_drew_with_it() -> None:
    client = LoopRecordingClient()
    source = PrefetchBatchSource(ClientSource(client))
    asyncio.run(source.next_batch())
    source.wait()
    source.close(client)
    assert len(client.used_on) == 1 and client.closed_on in client.used_on
    source.close(client)  # closing twice does nothing more


def test_an_object_without_close_is_refused_and_the_source_still_runs() -> None:
    source = PrefetchBatchSource(ClientSource(LoopRecordingClient()))
    with pytest.raises(TypeError, match="no aclose"):
        source.close(object())
    assert len(asyncio.run(source.next_batch()).items) == 1  # not stopped by the refusal
    source.close()


def test_an_http_client_used_on_the_prefetch_loop_closes_cleanly(unused_tcp_port: int) -> None:
    """The real case: httpx's pooled connections are bound to the prefetch loop; closing them
    from another loop raises "Event loop is closed" once that loop is gone."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=unused_tcp_port))
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{unused_tcp_port}")

    class HttpSource:
        async def next_batch(self) -> SAWBatch:
            assert (await http.get("/health")).status_code == 200
            return SAWBatch(items=[item(3, index=0)])

    async def serve_and_draw() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        source = PrefetchBatchSource(HttpSource())
        try:
            await source.next_batch()
            await asyncio.to_thread(source.wait)
        finally:
            await asyncio.to_thread(source.close, http)
            server.should_exit = True
            await task

    asyncio.run(serve_and_draw())
    assert http.is_closed
