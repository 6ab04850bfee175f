"""Benchmark: CPU cost of one completion request over HTTP, client and server side.

Starts `ludic serve` on the tiny local model (`LocalServer`, one torch thread) and sends
batches of `--in-flight` concurrent token-in completions of `--max-tokens` tokens (16 and 1 by
default: one GRPO step's requests, with as little generation as possible) through
`OpenAICompatibleClient`, once per transport, interleaved over `--rounds` rounds:

- `aiohttp`: the client's default (`ludic.inference.http.aiohttp_transport.AiohttpTransport`);
- `httpx`: httpx's own transport (`httpx.AsyncHTTPTransport()`, the default before).

Prints JSON: per transport, the median over rounds of this process's CPU milliseconds per
request (the client's cost, robust to other jobs on the machine) and of wall milliseconds per
batch, and the server process's CPU milliseconds per request (its HTTP handling plus the
engine's work for `--max-tokens` tokens, the same for both transports). Run:
`python bench/http_client.py [--rounds 5] [--batches 30] [--in-flight 16] [--max-tokens 1]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _args import show_defaults

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.http.local_server import LocalServer
from ludic.inference.http.openai_client import OpenAICompatibleClient
from ludic.models import build_tiny_model, save_model


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(
    client: OpenAICompatibleClient, server_pid: int, args: argparse.Namespace
) -> dict[str, float]:
    sampling = SamplingConfig(max_tokens=args.max_tokens, extras={"ignore_eos": True})
    request = ChatRequest(messages=[], prompt_token_ids=tuple(range(5, 25)), sampling=sampling)

    async def batch() -> None:
        await asyncio.gather(*(client.complete(request) for _ in range(args.in_flight)))

    await batch()  # connections open, server warm
    server, cpu, wall = process_cpu_s(server_pid), time.process_time(), time.perf_counter()
    for _ in range(args.batches):
        await batch()
    requests = args.batches * args.in_flight
    return {
        "client_cpu_ms_per_request": (time.process_time() - cpu) / requests * 1e3,
        "wall_ms_per_batch": (time.perf_counter() - wall) / args.batches * 1e3,
        "server_cpu_ms_per_request": (process_cpu_s(server_pid) - server) / requests * 1e3,
    }


async def measure(url: str, server_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    transports: dict[str, Any] = {"aiohttp": None, "httpx": httpx.AsyncHTTPTransport}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in transports}
    for r in range(args.rounds):
        order = list(transports) if r % 2 == 0 else list(reversed(transports))
        for name in order:
            make = transports[name]
            async with OpenAICompatibleClient(
                url, "tiny", transport=None if make is None else make()
            ) as client:
                runs[name].append(await one_round(client, server_pid, args))
    return {
        name: {key: statistics.median(run[key] for run in rs) for key in rs[0]}
        for name, rs in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=30, help="batches per round and arm")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=1)
    args = show_defaults(parser).parse_args()
    if min(args.rounds, args.batches, args.in_flight, args.max_tokens) < 1:
        raise SystemExit("--rounds, --batches, --in-flight and --max-tokens must be >= 1")
    with tempfile.TemporaryDirectory(prefix="http-bench-") as root:
        model, tokenizer = build_tiny_model(seed=0)
        save_model(model, tokenizer, f"{root}/tiny")
        with LocalServer(f"{root}/tiny", threads=1) as server:
            assert server.process is not None
            results = asyncio.run(measure(server.url, server.process.pid, args))
    print(
        json.dumps(
            {
                "benchmark": "http_client",
                "in_flight": args.in_flight,
                "max_tokens": args.max_tokens,
                "rounds": args.rounds,
                "batches_per_round": args.batches,
                "medians": results,
                "client_cpu_ratio_aiohttp_vs_httpx": results["aiohttp"]["client_cpu_ms_per_request"]
                / results["httpx"]["client_cpu_ms_per_request"],
                "loadavg": os.getloadavg(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
