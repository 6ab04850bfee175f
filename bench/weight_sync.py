"""Benchmark: `BroadcastPolicyPublisher.publish` vs a raw `torch.distributed` broadcast of the
same bytes, in the same run, over gloo on 127.0.0.1.

For the tiny model (~3M parameters) and a randomly initialised ~100M-parameter Llama (built
from a config, no hub), each round times each of these once, in a rotating order, every push
paired with a raw broadcast just before or just after it (alternating):
- raw: one broadcast of the model's bytes to a bare receiver process (the trainer's parameters
  are views into one flat buffer, so raw sends exactly the bytes publish sends), plus
  1-element messages so the time covers delivery (both sides reuse their buffers);
- publish: the full push to the embedded server in a subprocess (manifest and replies through
  the trainer's TCPStore, bucketed broadcasts, the server loading the weights), without
  verification, from the same flat parameters (`publish_s`; lying back to back, they travel as
  a few spans of up to `--bucket-mb`, in pieces of `--piece-mb`: 6 buckets, 25 broadcasts);
- publish from a copy whose parameters are separate allocations, as in a usual trainer, so
  packed buckets are copied into a send buffer (`publish_scattered_params_s`), and from a copy
  laid out by `TrainerConfig.contiguous_parameters` (a Trainer's default with a publisher:
  `publish_contiguous_params_*`), each to a server of its own;
- publish with HTTP control (`/start` + `/finish` requests, what the vLLM extension speaks;
  `publish_http_control_s`).
It does this with the engine as shipped, which receives straight into its parameters
(`EmbeddedEngine.update_weights_in_place`, packed parameters laid out back to back on the
first push), and with an engine without that method (`publish_buffered_s`: the receiver's
reused buffers, then one `update_weights` copy); verified pushes are interleaved with the
rest: with the defaults (version, exact checksums of what the server holds against the sent
tensors, finite weights; the logprob probe on every 10th push, so the timed rounds are
unprobed and `publish_verified_default_amortized_over_raw` adds a tenth of a probed push), and
with the probe on every push (two forward passes: `publish_verified_probe_every_push_s`).
Ratios are medians of per-pair publish / raw, so machine load drifts hit both, and, under
`best_of_rounds`, each arm's fastest push over the fastest raw broadcast (a loaded machine's
estimate of a quiet one); the report carries the load average before and after. Target:
publish <= 1.5x raw. Prints JSON.

`summary` gives, per model, the verified push over raw (median of pairs and best of rounds)
beside the target, and `verification_cpu_ms`: the CPU milliseconds a verified push uses beyond
an unverified one, in the trainer process and in the server process (medians per push, from
/proc: Linux only), which machine load does not change much.

    python bench/weight_sync.py [--models tiny,100m] [--repeats 5] [--bucket-mb 64] [--piece-mb 16]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import torch
from _args import positive_int, show_defaults
from _machine import measured_on
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.distributed import BroadcastPolicyPublisher
from ludic.distributed.transfer import Collective, host_store, join_store, open_group
from ludic.training.contiguous_params import make_contiguous_

TOKEN = "bench-token"
# ~100M parameters: 2 x 32000 x 640 embeddings (41M) + 12 layers x 4.96M (59.5M).
CONFIGS = {
    "100m": {
        "vocab_size": 32000,
        "hidden_size": 640,
        "intermediate_size": 1728,
        "num_hidden_layers": 12,
        "num_attention_heads": 10,
        "num_key_value_heads": 10,
    },
}


def build_model(name: str) -> LlamaForCausalLM:
    if name == "tiny":
        from ludic.models import build_tiny_model

        return build_tiny_model(seed=0)[0]
    config = LlamaConfig(
        **CONFIGS[name],
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, __file__, *args], env=env)


# -- raw broadcast --------------------------------------------------------------------------


def flatten_parameters_(model: torch.nn.Module) -> torch.Tensor:
    """Move every parameter into one flat float32 buffer (each becomes a view of it)."""
    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32)
    offset = 0
    with torch.no_grad():
        for p in params:
            view = flat[offset : offset + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
            offset += p.numel()
    return flat


class RawBaseline:
    """Bare receiver processes (`receivers` of them, one group), fed `flat` (the trainer's
    parameter bytes)."""

    def __init__(self, flat: torch.Tensor, receivers: int = 1) -> None:
        self.world_size = world = 1 + receivers
        store = host_store("127.0.0.1", 0, world_size=world, timeout_s=600)
        self.receivers = [
            _spawn("--raw-receiver", str(store.port), str(flat.numel()), str(rank), str(world))
            for rank in range(1, world)
        ]
        self.group: Collective = open_group(
            store, rank=0, world_size=world, backend="gloo", timeout_s=600
        )
        self.store = store
        self.flat = flat
        self.flag = torch.zeros(1)

    def once(self) -> float:
        started = time.perf_counter()
        self.flag.fill_(1)
        self.group.broadcast(self.flag, 0).wait()  # "another round follows"
        self.group.broadcast(self.flat, 0).wait()
        for rank in range(1, self.world_size):  # every receiver has everything
            self.group.broadcast(self.flag, rank).wait()
        return time.perf_counter() - started

    def close(self) -> None:
        self.flag.fill_(0)
        self.group.broadcast(self.flag, 0).wait()
        for receiver in self.receivers:
            receiver.wait(timeout=60)


def run_raw_receiver(port: int, numel: int, rank: int = 1, world_size: int = 2) -> None:
    store = join_store("127.0.0.1", port, world_size=world_size, timeout_s=600)
    group = open_group(store, rank=rank, world_size=world_size, backend="gloo", timeout_s=600)
    flat = torch.empty(numel, dtype=torch.float32).fill_(0)
    flag = torch.zeros(1)
    while True:
        group.broadcast(flag, 0).wait()
        if not flag.item():
            return
        group.broadcast(flat, 0).wait()
        for sender in range(1, world_size):
            group.broadcast(flag, sender).wait()


# -- the embedded server --------------------------------------------------------------------


def run_server(name: str, port: int, in_place: bool) -> None:
    import uvicorn

    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.inference.http.server import create_app
    from ludic.models import build_tiny_model

    torch.set_num_threads(1)
    model = build_model(name)
    tokenizer = build_tiny_model(seed=0)[1]

    class BufferedEngine(EmbeddedEngine):
        update_weights_in_place = None  # type: ignore[assignment]

    with (EmbeddedEngine if in_place else BufferedEngine)(model, tokenizer) as engine:
        app = create_app(engine, model_name=name, token=TOKEN)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def start_server(name: str, in_place: bool) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = _spawn("--serve", name, str(port), str(int(in_place)))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become healthy")


# -- rounds ---------------------------------------------------------------------------------


# Interleaved arms over store-controlled connections: (source, publisher attributes). The
# "scattered" source pushes to a server of its own: a server lays its parameters out after the
# trainer's buckets on its first push, and one trainer never alternates between two layouts.
# "verified" is the default verification's timed push (the probe is due on every 10th push
# only, so it is off here); "probed" runs the probe on every push. The "contiguous" source is a
# usual trainer's model after `TrainerConfig(contiguous_parameters=...)` laid it out
# (`make_contiguous_`, what a Trainer with a publisher does by default), with a server of its own.
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "store": ("flat", {"verify": False}),
    "scattered": ("scattered", {"verify": False}),
    "scattered_verified": ("scattered", {"verify": True, "probe": False}),
    "verified": ("flat", {"verify": True, "probe": False}),
    "probed": ("flat", {"verify": True, "probe": True, "probe_every": 1}),
    "contiguous": ("contiguous", {"verify": False}),
    "contiguous_verified": ("contiguous", {"verify": True, "probe": False}),
}


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds used so far by every thread of process `pid` (Linux /proc; else None)."""
    total_ns = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total_ns += int(f.read().split()[0])
    except (OSError, ValueError):  # not Linux, or a thread ended while read: no figure
        return None
    return total_ns / 1e9


def timed_rounds(
    model: torch.nn.Module,
    others: dict[str, tuple[torch.nn.Module, str, int]],
    raw: RawBaseline,
    url: str,
    repeats: int,
    bucket_mb: float,
    piece_mb: float,
    server_pid: int,
) -> dict[str, Any]:
    """Every round times each arm once, in a rotating order, each paired with a raw broadcast
    (raw first in even rounds, last in odd ones), so load drifts on the shared machine hit
    every arm alike; round 0 warms up. Arms (one publisher per source, its options switched
    between pushes): `model` (parameters in one flat buffer, as raw sends them) unverified, verified,
    verified with the probe; `scattered` (the same values, each parameter its own allocation,
    as in a usual trainer: packed buckets are copied into a send buffer) and `contiguous` (a
    usual trainer's model laid out by `make_contiguous_`), each from `others` (model, its own
    server's url, that server's pid). Then `model` over
    HTTP control (`/start` + `/finish`, what the vLLM extension speaks), its own connection,
    paired with raw the same way. Each push of the interleaved arms also records the CPU
    seconds it used in the trainer process (every thread) and in the server process
    (`{arm}_cpu_ms`: trainer, server; what verification costs apart from machine load)."""
    sources = {"flat": model, **{source: m for source, (m, _, _) in others.items()}}
    urls = {"flat": url, **{source: to for source, (_, to, _) in others.items()}}
    publishers = {
        source: BroadcastPolicyPublisher(
            to, TOKEN, bucket_mb=bucket_mb, piece_mb=piece_mb, verify=False
        )
        for source, to in urls.items()
    }
    pids = {"flat": server_pid, **{source: pid for source, (_, _, pid) in others.items()}}
    names = list(ARMS)
    pairs: dict[str, list[tuple[float, float]]] = {arm: [] for arm in [*names, "http"]}
    phases: dict[str, list[tuple[float, float]]] = {arm: [] for arm in names}
    cpu: dict[str, list[tuple[float, float]]] = {arm: [] for arm in names}
    last_cpu: list[tuple[float, float | None]] = []
    version = 0

    def paired(round_: int, push: Any, server_pid: int = server_pid) -> tuple[float, float]:
        nonlocal version
        version += 1
        raw_first = round_ % 2 == 0
        raw_s = raw.once() if raw_first else 0.0
        cpu_before = (time.process_time(), process_cpu_s(server_pid))
        started = time.perf_counter()
        push(version)
        push_s = time.perf_counter() - started
        server_after = process_cpu_s(server_pid)
        last_cpu[:] = [
            (
                time.process_time() - cpu_before[0],
                None
                if server_after is None or cpu_before[1] is None
                else server_after - cpu_before[1],
            )
        ]
        if not raw_first:
            raw_s = raw.once()
        return raw_s, push_s

    for round_ in range(repeats + 1):
        for arm in names[round_ % len(names) :] + names[: round_ % len(names)]:
            source, options = ARMS[arm]
            publisher = publishers[source]
            for key, value in {"probe": True, "probe_every": 10, **options}.items():
                setattr(publisher, key, value)
            pair = paired(
                round_,
                lambda v, s=sources[source], p=publisher: p.publish(s, version=v),
                pids[source],
            )
            if round_:  # round 0 warms up each arm (a new layout is acked once)
                pairs[arm].append(pair)
                stats = publisher.last_push
                assert stats is not None
                phases[arm].append((stats.transfer_seconds, stats.verify_seconds))
                trainer_cpu, server_cpu = last_cpu[0]
                cpu[arm].append((trainer_cpu, math.nan if server_cpu is None else server_cpu))
    last = publishers["flat"].last_push
    num_buckets = last.num_buckets if last else None
    buckets_of = {
        f"num_buckets_{source}": getattr(publishers[source].last_push, "num_buckets", None)
        for source in others
    }
    for publisher in publishers.values():
        publisher.close()
    http = BroadcastPolicyPublisher(
        url, TOKEN, bucket_mb=bucket_mb, piece_mb=piece_mb, verify=False, control="http"
    )
    for round_ in range(repeats + 1):
        pair = paired(round_, lambda v: http.publish(model, version=v))
        if round_:
            pairs["http"].append(pair)
    http.close()
    results: dict[str, Any] = {
        "raw_s": statistics.median(r for arm in pairs.values() for r, _ in arm),
        "num_buckets": num_buckets,
        **buckets_of,
    }
    results["raw_best_s"] = min(r for arm in pairs.values() for r, _ in arm)
    for arm, arm_pairs in pairs.items():
        results[f"{arm}_s"] = statistics.median(p for _, p in arm_pairs)
        results[f"{arm}_over_raw"] = statistics.median(p / r for r, p in arm_pairs)
        results[f"{arm}_best_s"] = min(p for _, p in arm_pairs)
    for arm, times in phases.items():
        results[f"{arm}_transfer_s"] = statistics.median(t for t, _ in times)
        results[f"{arm}_verify_s"] = statistics.median(v for _, v in times)
    for arm, used in cpu.items():
        results[f"{arm}_cpu_ms"] = {
            "trainer": round(1e3 * statistics.median(t for t, _ in used), 1),
            "server": round(1e3 * statistics.median(s for _, s in used), 1),
        }
    return results


def bench_model(name: str, repeats: int, bucket_mb: float, piece_mb: float) -> dict[str, Any]:
    model = build_model(name)
    scattered = build_model(name)  # same seed, same values; parameters stay separate
    contiguous = build_model(name)  # laid out as a Trainer with a publisher does
    make_contiguous_(contiguous)
    numel = sum(t.numel() for t in model.state_dict().values())
    flat = flatten_parameters_(model)
    if flat.numel() != numel:
        raise RuntimeError("the state dict holds more than the parameters")
    raw = RawBaseline(flat)
    modes = {}
    for mode in ("buffered", "in_place"):
        servers = [start_server(name, in_place=mode == "in_place") for _ in range(3)]
        (server, url), (other, other_url), (third, third_url) = servers
        others = {
            "scattered": (scattered, other_url, other.pid),
            "contiguous": (contiguous, third_url, third.pid),
        }
        try:
            modes[mode] = timed_rounds(
                model, others, raw, url, repeats, bucket_mb, piece_mb, server.pid
            )
        finally:
            for started, _ in servers:
                started.terminate()
                started.wait(timeout=60)
    raw.close()
    buffered, in_place = modes["buffered"], modes["in_place"]
    return {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": numel * 4,
        "num_buckets": in_place["num_buckets"],
        "raw_broadcast_s": statistics.median([buffered["raw_s"], in_place["raw_s"]]),
        "publish_s": in_place["store_s"],
        "publish_over_raw": in_place["store_over_raw"],
        "publish_scattered_params_s": in_place["scattered_s"],
        "publish_scattered_params_over_raw": in_place["scattered_over_raw"],
        "publish_scattered_params_verified_over_raw": in_place["scattered_verified_over_raw"],
        "publish_contiguous_params_over_raw": in_place["contiguous_over_raw"],
        "publish_contiguous_params_verified_over_raw": in_place["contiguous_verified_over_raw"],
        "num_buckets_contiguous_params": in_place["num_buckets_contiguous"],
        "num_buckets_scattered_params": in_place["num_buckets_scattered"],
        "publish_http_control_s": in_place["http_s"],
        "publish_http_control_over_raw": in_place["http_over_raw"],
        "publish_verified_s": in_place["verified_s"],
        "publish_verified_over_raw": in_place["verified_over_raw"],
        "publish_cpu_ms_per_push": {
            "unverified": in_place["store_cpu_ms"],
            "verified": in_place["verified_cpu_ms"],
            "scattered_params_unverified": in_place["scattered_cpu_ms"],
            "scattered_params_verified": in_place["scattered_verified_cpu_ms"],
            "contiguous_params_unverified": in_place["contiguous_cpu_ms"],
            "contiguous_params_verified": in_place["contiguous_verified_cpu_ms"],
        },
        "publish_verified_phases_s": {
            "unverified_transfer": in_place["store_transfer_s"],
            "verified_transfer": in_place["verified_transfer_s"],
            "verified_after_reply": in_place["verified_verify_s"],
        },
        "publish_verified_probe_every_push_s": in_place["probed_s"],
        "publish_verified_probe_every_push_over_raw": in_place["probed_over_raw"],
        "publish_verified_default_amortized_over_raw": (
            9 * in_place["verified_over_raw"] + in_place["probed_over_raw"]
        )
        / 10,
        "publish_buffered_s": buffered["store_s"],
        "publish_buffered_over_raw": buffered["store_over_raw"],
        "target_publish_over_raw": 1.5,
        # Best of all rounds (the least disturbed push of each arm, over the least disturbed
        # raw broadcast): what a quiet machine gives, estimated on a loaded one.
        "best_of_rounds": {
            "raw_s": in_place["raw_best_s"],
            **{
                f"{arm}_over_raw": in_place[f"{arm}_best_s"] / in_place["raw_best_s"]
                for arm in (*ARMS, "http")
            },
            "buffered_over_raw": buffered["store_best_s"] / buffered["raw_best_s"],
        },
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The verified push over raw (the issue's target), at a glance."""
    target = result["target_publish_over_raw"]
    median = result["publish_verified_over_raw"]
    return {
        "raw_broadcast_s": round(result["raw_broadcast_s"], 4),
        "verified_s": round(result["publish_verified_s"], 4),
        "verified_over_raw": round(median, 3),
        "verified_over_raw_best_of_rounds": round(result["best_of_rounds"]["verified_over_raw"], 3),
        "verified_amortized_probe_over_raw": round(
            result["publish_verified_default_amortized_over_raw"], 3
        ),
        "unverified_over_raw": round(result["publish_over_raw"], 3),
        # a usual trainer (each parameter its own allocation: packed buckets, ~95 broadcasts)
        "scattered_params_over_raw": round(result["publish_scattered_params_over_raw"], 3),
        "scattered_params_verified_over_raw": round(
            result["publish_scattered_params_verified_over_raw"], 3
        ),
        # the same usual trainer laid out by TrainerConfig.contiguous_parameters (its default
        # with a publisher): a few spans, no packing copy
        "contiguous_params_over_raw": round(result["publish_contiguous_params_over_raw"], 3),
        "contiguous_params_verified_over_raw": round(
            result["publish_contiguous_params_verified_over_raw"], 3
        ),
        # CPU of verification (verified push minus unverified, medians per push): what the
        # checksums cost each side, whatever the load.
        "verification_cpu_ms": {
            side: round(
                result["publish_cpu_ms_per_push"]["verified"][side]
                - result["publish_cpu_ms_per_push"]["unverified"][side],
                1,
            )
            for side in ("trainer", "server")
        },
        "target": target,
        "target_applies": result["model"] == "100m",  # the bar; tiny is latency-bound
        "verified_within_target": median <= target,
    }


def bench_servers(
    name: str, counts: list[int], repeats: int, bucket_mb: float, piece_mb: float
) -> dict[str, Any]:
    """`--servers 1,2,3`: one publisher pushing to N embedded servers in one group (one
    broadcast reaches them all), for each N: the median and best push, unverified and
    verified (checksums on every server), each over the one-server time, and a raw gloo
    broadcast of the same bytes to N bare receivers (timed alternately with the pushes), the
    transport's own cost of N receivers on this machine."""
    model = build_model(name)
    flat = flatten_parameters_(model)  # raw sends exactly the bytes publish sends
    started = [start_server(name, in_place=True) for _ in range(max(counts))]
    try:
        times: dict[int, dict[str, list[float]]] = {}
        for n in counts:
            urls = [url for _, url in started[:n]]
            publisher = BroadcastPolicyPublisher(
                urls, TOKEN, bucket_mb=bucket_mb, piece_mb=piece_mb, probe=False
            )
            raw = RawBaseline(flat, receivers=n)
            times[n] = {"unverified": [], "verified": [], "raw": []}
            for round_ in range(repeats + 1):  # round 0 joins and warms up
                for arm in ("unverified", "raw", "verified"):
                    publisher.verify = arm == "verified"
                    began = time.perf_counter()
                    if arm == "raw":
                        raw.once()
                    else:
                        publisher.publish(model, version=round_ * 2 + (arm == "verified"))
                    if round_:
                        times[n][arm].append(time.perf_counter() - began)
            raw.close()
            publisher.close()
    finally:
        for server, _ in started:
            server.terminate()
            server.wait(timeout=60)
    one = {arm: statistics.median(t) for arm, t in times[counts[0]].items()}
    names = {"unverified": "publish_unverified", "verified": "publish_verified", "raw": "raw"}
    return {
        "model": name,
        "bytes": sum(t.numel() * t.element_size() for t in model.state_dict().values()),
        "by_servers": {
            str(n): {
                **{f"{names[arm]}_s": statistics.median(t) for arm, t in by_arm.items()},
                **{f"{names[arm]}_best_s": min(t) for arm, t in by_arm.items()},
                **{
                    f"{names[arm]}_over_{counts[0]}_server": statistics.median(t) / one[arm]
                    for arm, t in by_arm.items()
                },
                "publish_unverified_over_raw": statistics.median(by_arm["unverified"])
                / statistics.median(by_arm["raw"]),
            }
            for n, by_arm in times.items()
        },
    }


def megabytes(minimum_exclusive: bool) -> Any:
    """An argparse type: a size in MB, > 0 (`minimum_exclusive`) or >= 0."""

    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < 0 or (minimum_exclusive and value == 0):
            raise argparse.ArgumentTypeError(
                f"must be {'> 0' if minimum_exclusive else '>= 0 (0: whole buckets)'}, got {value}"
            )
        return value

    return parse


def model_names(text: str) -> list[str]:
    """An argparse type: comma-separated models of `tiny` and `CONFIGS`."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n != "tiny" and n not in CONFIGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown model(s) {unknown}; choose from {['tiny', *CONFIGS]}, comma-separated"
        )
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--models",
        type=model_names,
        default="tiny,100m",
        help=f"comma-separated, of: {', '.join(['tiny', *CONFIGS])}",
    )
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--bucket-mb", type=megabytes(True), default=64.0)
    parser.add_argument("--piece-mb", type=megabytes(False), default=16.0, help="0: whole buckets")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument(
        "--servers",
        default="",
        help="instead, time one push to N servers at once, e.g. 1,2,3 (`servers` in the report)",
    )
    parser.add_argument("--raw-receiver", nargs="+", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = show_defaults(parser).parse_args()
    if args.raw_receiver:
        run_raw_receiver(*args.raw_receiver)
        return
    if args.serve:
        run_server(args.serve[0], int(args.serve[1]), in_place=args.serve[2] == "1")
        return
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    models = args.models
    results = (
        []
        if args.servers
        else [bench_model(m, args.repeats, args.bucket_mb, args.piece_mb) for m in models]
    )
    report: dict[str, Any] = {
        "benchmark": "weight_sync",
        "backend": "gloo (CPU, 127.0.0.1)",
        "bucket_mb": args.bucket_mb,
        "piece_mb": args.piece_mb,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "peak_rss_mb_trainer": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "summary": {r["model"]: summary(r) for r in results},
        "results": results,
    }
    if args.servers:
        counts = [int(n) for n in args.servers.split(",")]
        report["servers"] = [
            bench_servers(m, counts, args.repeats, args.bucket_mb, args.piece_mb) for m in models
        ]
    report["measured_on"] = measured_on(load_before)  # the CPU model: platform's is x86_64
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
