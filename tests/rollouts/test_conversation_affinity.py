"""RolloutEngine opens one conversation per episode (`ludic.inference.http.affinity`), so a
client routing over several servers keeps every call of an episode on one server."""

from __future__ import annotations

from collections.abc import Hashable

from rollout_fakes import CountEnv, LoopProtocol

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.http.affinity import current_conversation
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest


class RecordingClient:
    """Answers "ok" and records the conversation each call was made in."""

    def __init__(self) -> None:
        self.keys: list[Hashable | None] = []

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.keys.append(current_conversation())
        return ChatResponse(text="ok")


async def test_each_episode_is_one_conversation() -> None:
    client = RecordingClient()
    engine = RolloutEngine(
        env_registry={"count": lambda **kw: CountEnv(**kw)},
        protocol_registry={"loop": lambda **kw: LoopProtocol(client, **kw)},
        concurrency=4,
    )
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="count", kwargs={"length": 3}),
            protocol=ComponentSpec(name="loop", kwargs={"max_steps": 5}),
            env_seed=i,
            request_id=f"r{i}",
        )
        for i in range(4)
    ]
    await engine.run(requests)
    assert sorted(set(client.keys)) == ["r0", "r1", "r2", "r3"]  # type: ignore[type-var]
    assert all(client.keys.count(f"r{i}") == 3 for i in range(4))  # every turn of r_i
    assert current_conversation() is None  # nothing leaks out of the episode
