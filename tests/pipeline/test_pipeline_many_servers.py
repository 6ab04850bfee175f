"""`ludic actor` and `ludic learner` with several --server-url: the actor's client spreads
episodes over all of them (a ServerPool), the learner's publisher pushes to all of them."""

from __future__ import annotations

import pytest

from ludic.distributed import BroadcastPolicyPublisher
from ludic.inference.http.pool import ServerPool
from ludic.pipeline.commands import _actor_client, _publisher
from ludic.pipeline.config import ActorConfig, LearnerConfig
from ludic.pipeline.versions import RecordingPublisher
from ludic.recipes.inference import ModelCard

URLS = ("http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003")


async def test_the_actor_spreads_over_every_server(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def model_cards(url: str, api_key: str | None = None, **_: object) -> list[ModelCard]:
        asked.append(url)  # no real HTTP call to these fixed ports, where anything may listen
        return [ModelCard(id="tiny", owned_by="ludic")]

    monkeypatch.setattr("ludic.recipes.served_model.model_cards", model_cards)
    client = await _actor_client(ActorConfig(server_url=URLS, served_model="tiny"))
    # --served-model and the context --max-tokens needs checked against every server, each
    # asked once (served_model_for asked each twice: once per check)
    assert sorted(asked) == sorted(URLS)
    assert isinstance(client, ServerPool)
    assert [s.url for s in client.servers] == list(URLS)
    await client.aclose()


def test_the_learner_publishes_to_every_server() -> None:
    publisher = _publisher(
        LearnerConfig(server_url=URLS, token="t", server_ranks=2), None, run=lambda: None
    )
    assert isinstance(publisher, RecordingPublisher)  # records each version before the push
    assert isinstance(publisher.publisher, BroadcastPolicyPublisher)
    assert [s.url for s in publisher.servers] == list(URLS)
    assert [s.ranks for s in publisher.servers] == [2, 2, 2]  # tensor-parallel servers
    publisher.close()


def test_a_server_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="names a server twice"):
        _publisher(LearnerConfig(server_url=(URLS[0], URLS[0]), token="t"), None, run=lambda: None)
