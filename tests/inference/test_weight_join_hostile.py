"""`/ludic/weights/init` with values no join can use: an infinite, nan or absurdly long
`timeout_s` (an inf killed the join's timer thread with an OverflowError traceback in the
server's log, and the join then never timed out) and an empty host are a 400 naming the field,
and no join starts. Through `ludic serve`'s app, in process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

TOKEN = "join-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    with engine, TestClient(create_app(engine, model_name="tiny", token=TOKEN)) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"host": "127.0.0.1", "port": 1, "timeout_s": Infinity}',
            "timeout_s: Input should be a finite number",
        ),
        (
            b'{"host": "127.0.0.1", "port": 1, "timeout_s": NaN}',
            "timeout_s: Input should be a finite number",
        ),
        (
            b'{"host": "127.0.0.1", "port": 1, "timeout_s": 1e300}',
            "timeout_s: Input should be less than or equal to 604800",
        ),
        (
            b'{"host": "", "port": 1, "timeout_s": 1}',
            "host: String should have at least 1 character",
        ),
    ],
)
def test_a_join_no_trainer_can_answer_is_a_400_and_starts_nothing(
    client: TestClient, body: bytes, message: str
) -> None:
    reply = client.post("/ludic/weights/init", headers=AUTH, content=body)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]
    status = client.get("/ludic/weights/status", headers=AUTH).json()
    assert not status["joining"] and not status["connected"] and status["join_error"] is None
