"""A weight push a server refuses (a 4xx: a wrong token, a model of another shape, a request it
cannot take) raises `PushRefused`: a refusal (the `ludic` command prints its message, no
traceback) and a WeightPushError, whose message names each server's URL, the HTTP status, the
server's own words and what to do. Real embedded servers in process (FastAPI TestClient) for
the publisher, scripted replies for the group's other paths."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from distributed_fakes import SPEC, TOKEN
from fastapi.testclient import TestClient
from rich.console import Console

from ludic.cli import main
from ludic.distributed import BroadcastPolicyPublisher, PushRefused, WeightPushError
from ludic.distributed.server_group import ServerGroup
from ludic.distributed.server_link import Refused, ServerLink, ServerUnreachable, TooFewServers
from ludic.errors import is_refusal
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.openai_protocol import error_body
from ludic.inference.http.server import create_app
from ludic.models import build_tiny_model
from ludic.pipeline import commands
from ludic.pipeline.config import LearnerConfig
from ludic.recipes.train_start import StartingWeightsRefused, _publish_start

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

WIDE = replace(SPEC, hidden_size=64, intermediate_size=128)  # another shape than SPEC
OTHER_MODEL_FIX = "The server serves another model than the trainer's"
TOKEN_FIX = "give the trainer the token the server was started with"


class Client(TestClient):
    def request(self, method: str, url: Any, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        kwargs.pop("timeout", None)  # TestClient deprecates it; nothing here is slow
        return super().request(method, url, **kwargs)


@pytest.fixture
def wide_server() -> Iterator[Client]:
    """An embedded server (weight-sync routes, token TOKEN) of the WIDE model at http://wide."""
    model, tokenizer = build_tiny_model(seed=0, spec=WIDE)
    engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
    client = Client(create_app(engine, model_name="wide", token=TOKEN), base_url="http://wide")
    with client:
        yield client
    engine.close()


def _push(client: Client, token: str, control: str = "auto") -> None:
    """A trainer of the SPEC model pushes version 1 to the server `client` talks to."""
    model = build_tiny_model(seed=0, spec=SPEC)[0]
    publisher = BroadcastPolicyPublisher(
        ["http://wide"], token, http=[client], timeout_s=20, control=control
    )
    try:
        publisher.publish(model, version=1)
    finally:
        publisher.close()


@pytest.mark.parametrize("control", ["store", "http"])
def test_a_server_of_another_shape_refuses_the_push_naming_it_and_the_fix(
    wide_server: Client, control: str
) -> None:
    with pytest.raises(PushRefused) as caught:
        _push(wide_server, TOKEN, control)
    message = str(caught.value)
    assert is_refusal(caught.value) and isinstance(caught.value, WeightPushError)
    assert "server http://wide: " in message and " refused (400): " in message, message
    assert "shape mismatches" in message  # the server's own words
    # the server's words say to start the trainer from its model; the fix does not repeat it
    assert message.endswith(OTHER_MODEL_FIX + " (another architecture or size)"), message
    assert [r.status for r in caught.value.refusals] == [400]
    copied = pickle.loads(pickle.dumps(caught.value))  # e.g. sent to the other ranks
    assert str(copied) == message and copied.refusals == caught.value.refusals


def test_a_wrong_token_is_refused_naming_the_token_flags(wide_server: Client) -> None:
    with pytest.raises(PushRefused) as caught:
        _push(wide_server, "not-the-token")
    message = str(caught.value)
    assert is_refusal(caught.value)
    assert message.startswith("server http://wide: GET /ludic/weights/status refused (401): ")
    assert "wrong bearer token" in message and TOKEN_FIX in message
    assert "`ludic learner --token`" in message and "`ludic train --server-token`" in message


def test_ludic_learner_prints_the_refusal_as_one_error_line(
    wide_server: Client, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def learner_pushing_to_another_shape(cfg: LearnerConfig) -> list[dict[str, float]]:
        _push(wide_server, TOKEN)
        return []

    monkeypatch.delenv("LUDIC_TRACEBACK", raising=False)
    monkeypatch.setattr(commands, "run_learner", learner_pushing_to_another_shape)
    with pytest.raises(SystemExit) as exited:
        main(["learner", "--server-url", "http://wide"], report_refusals=True)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("ludic learner: error:")]
    assert len(errors) == 1, err
    assert "http://wide" in errors[0] and "(400)" in errors[0] and OTHER_MODEL_FIX in errors[0]
    assert "Traceback" not in err


def _link(url: str, answer: tuple[int, dict[str, Any]]) -> ServerLink:
    status, body = answer
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json=body))
    return ServerLink(url, "token", http=httpx.Client(base_url=url, transport=transport))


@pytest.mark.parametrize(
    ("status", "said", "fix"),
    [
        (401, "missing or wrong bearer token for a control endpoint", TOKEN_FIX),
        (403, "weight sync is disabled: start the server with a token", "restart it with one"),
        (404, "unknown control endpoint /ludic/weights/status", "no Ludic weight-sync endpoints"),
        (400, "refused weight manifest: 3 shape mismatches, e.g. [...]", OTHER_MODEL_FIX),
        (409, "a push is already in progress: finish it first", "fix what the server names"),
    ],
)
def test_every_4xx_is_a_refusal_naming_url_status_words_and_fix(
    status: int, said: str, fix: str
) -> None:
    with pytest.raises(PushRefused) as caught:
        _link("http://s0:8000", (status, error_body(status, said))).status()
    message = str(caught.value)
    assert is_refusal(caught.value)
    assert message.startswith(
        f"server http://s0:8000: GET /ludic/weights/status refused ({status}): {said}. "
    )
    assert fix in message


def test_a_5xx_stays_a_failure_that_may_be_retried() -> None:
    with pytest.raises(ServerUnreachable) as caught:
        _link("http://s0:8000", (503, error_body(503, "loading"))).status()
    assert not is_refusal(caught.value) and not isinstance(caught.value, PushRefused)


def _group(*servers: ServerLink) -> ServerGroup:
    group = ServerGroup(
        servers,
        backend="gloo",
        master_addr="127.0.0.1",
        timeout_s=5,
        control="http",
        min_servers=1,
    )
    group.members = list(servers)  # joined (what `connect` would have done)
    return group


class RefusingChannel:
    """A store channel whose server answers the manifest or the push with `reply`."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    def send_manifest(self, manifest: Any) -> bool:
        return True  # a new layout: the group waits for the ack

    def wait_reply(self, kind: str, **kwargs: Any) -> dict[str, Any]:
        return self.reply


def test_refusals_of_several_servers_end_in_one_refusal_naming_each() -> None:
    shape = "refused weight manifest: 1 shape mismatches, e.g. [...]"
    nan = "refused weight push: 1 tensor(s) hold nan or inf (w)"
    first = _link("http://s0", (400, error_body(400, shape)))
    second = _link("http://s1", (400, error_body(400, shape)))
    third = _link("http://s2", (200, {}))
    third.channel = RefusingChannel({"error": nan, "status": 422})  # type: ignore[assignment]
    with pytest.raises(PushRefused) as caught:
        _group(first, second, third).replies()
    message = str(caught.value)
    assert message.startswith(
        f"server http://s0: POST /ludic/weights/finish refused (400): {shape}; "
        f"server http://s1: POST /ludic/weights/finish refused (400): {shape}; "
        f"server http://s2: push refused (422): {nan}. {OTHER_MODEL_FIX}"
    ), message
    assert message.count(OTHER_MODEL_FIX) == 1  # each fix once
    assert message.endswith("a run that saved checkpoints resumes from its last one")


def test_a_manifest_refused_over_the_store_is_a_refusal() -> None:
    server = _link("http://s0", (200, {}))
    said = "refused weight manifest: 2 tensors the served model does not have, e.g. [...]"
    server.channel = RefusingChannel({"error": said, "status": 400})  # type: ignore[assignment]
    with pytest.raises(PushRefused) as caught:
        _group(server).request_push(manifest=None)  # type: ignore[arg-type]
    assert str(caught.value).startswith(f"server http://s0: push refused (400): {said}. ")
    assert OTHER_MODEL_FIX in str(caught.value)


class FailingTrainer:
    """What `ludic train` holds when its starting-weights push fails with `error`."""

    policy_version = 0

    def __init__(self, error: Exception) -> None:
        self.error, self.closed = error, False

    def publish_weights(self) -> float:
        raise self.error

    def close(self) -> None:
        self.closed = True


def _start(error: Exception) -> BaseException:
    trainer = FailingTrainer(error)
    cfg = SimpleNamespace(model="DIR")
    with pytest.raises(WeightPushError) as caught:
        _publish_start(trainer, cfg, Console(quiet=True))  # type: ignore[arg-type]
    assert trainer.closed
    return caught.value


def test_ludic_train_says_an_unreached_server_did_not_refuse_the_starting_weights() -> None:
    gone = TooFewServers("0 of 1 servers could be reached (min_servers=1): http://s0: gone")
    error = _start(gone)
    assert isinstance(error, TooFewServers) and is_refusal(error)
    assert "refused" not in str(error)
    assert str(error) == (
        "could not push this run's starting weights (--model DIR) to --server-url before any "
        f"episode: {gone}"
    )


def test_ludic_train_says_a_server_refused_the_starting_weights() -> None:
    refusal = PushRefused([Refused(url="http://s0", what="push", status=400, said="no")])
    error = _start(refusal)
    assert isinstance(error, StartingWeightsRefused) and is_refusal(error)
    assert str(error).startswith("--server-url refused this run's starting weights (--model DIR)")
