"""Training against three `ludic serve` processes on 127.0.0.1 (gloo): every step's weights
reach and are verified on all three in one broadcast, episodes spread over them (each on one
server), and when one server is killed mid-run the rollouts carry on on the other two, the push
names it, and the restarted server is brought back to the current version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tyro
from serve_fakes import TOKEN, Server

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Three servers shared by the tests here (starting one costs seconds); each test
    publishes its own weights first."""
    from ludic.models import tiny_model_dir

    model_dir, logs = str(tiny_model_dir()), tmp_path_factory.mktemp("servers")
    made = [Server(model_dir, logs / f"server{i}.log").start() for i in range(3)]
    try:
        for server in made:
            server.wait()
        yield made
    finally:
        for server in made:
            server.stop()


def _episodes(path: Path) -> list[dict[str, Any]]:
    """Each logged episode: the servers its model calls went to and their policy versions."""
    episodes = []
    for line in path.read_text().splitlines():
        rollout = json.loads(line)
        infos = [s["info"] for s in rollout["steps"] if s.get("kind", "agent") == "agent"]
        infos = [i for i in infos if "served_by" in i]
        episodes.append(
            {
                "servers": {i["served_by"] for i in infos},
                "versions": {i["policy_version"] for i in infos},
                "failed_over_from": [u for i in infos for u in i.get("failed_over_from", [])],
                "calls": len(infos),
            }
        )
    return episodes


def test_ludic_train_pushes_every_step_to_three_servers(
    servers: list[Server], tmp_path: Path
) -> None:
    urls = [s.url for s in servers]
    args = ["--server-url", *urls, "--server-token", TOKEN, "--model", servers[0].model_dir]
    args += ["--steps", "2", "--problems-per-step", "2", "--group-size", "3"]
    args += ["--max-tokens", "4", "--max-steps", "2", "--context", "latest"]
    args += ["--out-dir", str(tmp_path / "run"), "--no-progress"]
    cfg = tyro.cli(TrainConfig, args=args)  # the command line `ludic train` parses
    assert cfg.server_url == tuple(urls)
    assert train_command(cfg).steps == 2
    assert [s.served_version() for s in servers] == [2, 2, 2]  # each push reached all three
    episodes = _episodes(tmp_path / "run" / "rollouts.jsonl")
    assert len(episodes) == 12 and all(e["calls"] >= 1 for e in episodes)
    assert all(len(e["servers"]) == 1 for e in episodes)  # an episode stays on its server
    assert len(set().union(*(e["servers"] for e in episodes))) >= 2  # episodes spread
    # every server was at the same version when it sampled: 0 in step 1, 1 in step 2
    assert [e["versions"] for e in episodes] == [{0}] * 6 + [{1}] * 6


async def test_a_server_killed_mid_run_is_routed_around_reported_and_brought_back(
    servers: list[Server], tmp_path: Path
) -> None:
    from ludic.agents import Agent
    from ludic.context import LatestObservationContext
    from ludic.eval.env_spec import resolve_env_factory, resolve_parser
    from ludic.inference.sampling import SamplingConfig
    from ludic.interaction import SingleAgentProtocol
    from ludic.recipes import algorithms, load_policy, make_inference, make_trainer
    from ludic.rollouts import (
        ComponentSpec,
        GRPORequestStrategy,
        RolloutEngine,
        RolloutRequest,
        SeedSequencer,
    )
    from ludic.training import RolloutBatchSource

    model, tokenizer = load_policy(servers[0].model_dir)
    urls = [s.url for s in servers]
    inference = make_inference(model, tokenizer, server_url=urls, server_token=TOKEN)
    publisher: Any = inference.publisher
    env_factory = resolve_env_factory("tictactoe")
    parser = resolve_parser("auto", env_factory, {})
    sampling = SamplingConfig(temperature=1.0, max_tokens=4)

    def protocol() -> SingleAgentProtocol:
        agent = Agent(
            inference.client, context=LatestObservationContext(), parser=parser, sampling=sampling
        )
        return SingleAgentProtocol(agent, max_steps=2)

    log = tmp_path / "rollouts.jsonl"
    algorithm = algorithms.make_algorithm("grpo", max_tokens=4)
    source = RolloutBatchSource(
        engine=RolloutEngine(
            env_registry={"env": env_factory}, protocol_registry={"agent": protocol}, jsonl_log=log
        ),
        requests_fn=lambda: [
            RolloutRequest(env=ComponentSpec(name="env"), protocol=ComponentSpec(name="agent"))
            for _ in range(2)
        ],
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=3),
        seed_sequencer=SeedSequencer(run_seed=0),
    )
    trainer = make_trainer(
        model, tokenizer, algorithm, source, out=tmp_path, lr=1e-4, publisher=publisher
    )
    try:
        trainer.publish_weights()  # the servers may hold another run's weights: start from ours
        await trainer.train_step()  # version 1 on all three
        assert [s.served_version() for s in servers] == [1, 1, 1]
        assert len(publisher.last_push.servers) == 3

        servers[2].kill()
        metrics = await trainer.train_step()  # rollouts on two servers; the push names the third
        assert metrics["batch/num_samples"] > 0
        step2 = _episodes(log)[6:]
        assert all(e["calls"] >= 1 and e["servers"] <= set(urls[:2]) for e in step2)
        assert all(e["versions"] == {1} for e in step2)
        moved = [u for e in step2 for u in e["failed_over_from"]]
        assert set(moved) <= {urls[2]}  # an episode that tried the dead one moved, recorded
        assert publisher.last_push.servers == tuple(urls[:2])
        assert list(publisher.last_push.missed) == [urls[2]]
        assert [s.served_version() for s in servers[:2]] == [2, 2]

        servers[2].start().wait()  # restarted: a fresh process at version 0
        assert servers[2].served_version() == 0
        await trainer.train_step()  # the push re-initialises it at the current version
        assert [s.served_version() for s in servers] == [3, 3, 3]
        assert publisher.last_push.missed == {} and len(publisher.last_push.servers) == 3

        await trainer.train_step()  # and it takes episodes again, at the current version
        step4 = _episodes(log)[18:]
        assert any(e["servers"] == {urls[2]} for e in step4)
        assert all(e["versions"] == {3} for e in step4)
        assert [s.served_version() for s in servers] == [4, 4, 4]
    finally:
        trainer.close()
        publisher.close()
        await inference.aclose()
