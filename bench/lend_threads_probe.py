"""Probe: what `torch.set_num_threads` from one thread does to another, and what a second
intra-op thread buys the training forward + backward of `bench/rl_step.py`'s batch.

Part 1 (semantics): a worker thread runs ops (its OpenMP ICV is set lazily from torch's global
count), then the main thread calls `torch.set_num_threads(n)`; prints what each thread sees
(`torch.get_num_threads()`) and how many OpenMP/MKL threads the worker's ops then use
(GEMM time at 1 vs 2 as a witness).
Part 2 (timing): forward + backward of the rl_step batch (16 rows x `--tokens` tokens) on a
non-main thread at 1 thread, at 2 threads, and switched 1 -> 2 from a hook halfway through
the backward (as `lend_idle_threads` does), interleaved and order-swapped, wall and process CPU
seconds, with the load average. Prints JSON.

    python bench/lend_threads_probe.py [--model 50m|tiny] [--rounds 6] [--tokens 80]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch
from _args import show_defaults


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def on_thread(fn: Any) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def gemm_seconds(n: int = 768, reps: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    started = time.perf_counter()
    for _ in range(reps):
        a @ b
    return (time.perf_counter() - started) / reps


def semantics() -> dict[str, Any]:
    """Does set_num_threads on the main thread reach a worker that already ran ops?"""
    torch.set_num_threads(1)
    seen: dict[str, Any] = {}
    go, done = threading.Event(), threading.Event()

    def worker() -> None:
        seen["worker_before"] = torch.get_num_threads()
        seen["worker_gemm_before_s"] = gemm_seconds()
        go.wait()
        seen["worker_after_main_set_2"] = torch.get_num_threads()
        seen["worker_gemm_after_s"] = gemm_seconds()
        torch.set_num_threads(1)  # what a worker setting its own count does to main
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(1.0)
    torch.set_num_threads(2)
    seen["main_after_set_2"] = torch.get_num_threads()
    go.set()
    done.wait()
    thread.join()
    seen["main_after_worker_set_1"] = torch.get_num_threads()
    seen["fresh_thread_sees"] = on_thread(torch.get_num_threads)
    torch.set_num_threads(1)
    seen["gemm_1t_s"] = gemm_seconds()
    torch.set_num_threads(2)
    seen["gemm_2t_s"] = gemm_seconds()
    torch.set_num_threads(1)
    return seen


def timing(model_name: str, rounds: int, tokens: int) -> dict[str, Any]:
    from ludic.models import TinyModelSpec, build_tiny_model

    specs = {
        "tiny": {},
        "50m": dict(
            hidden_size=768,
            intermediate_size=1920,
            num_hidden_layers=8,
            num_attention_heads=12,
            num_key_value_heads=4,
        ),
    }
    model, _ = build_tiny_model(seed=0, spec=TinyModelSpec(**specs[model_name]))
    model.float().train()
    ids_BT = torch.randint(0, model.config.vocab_size, (16, tokens))
    layers = list(model.model.layers)
    switch = {"armed": False}

    def lend(*_: Any) -> None:  # backward pre-hook of the middle layer: switch mid-backward
        if switch["armed"]:
            torch.set_num_threads(2)
            switch["armed"] = False

    layers[len(layers) // 2].register_full_backward_pre_hook(lend)

    def step(arm: str) -> tuple[float, float]:
        torch.set_num_threads(2 if arm == "2t" else 1)
        switch["armed"] = arm == "switch"
        cpu, started = time.process_time(), time.perf_counter()
        logits = model(input_ids=ids_BT).logits
        logits.log_softmax(-1).mean().backward()
        model.zero_grad(set_to_none=True)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        torch.set_num_threads(1)
        return wall, cpu

    arms = ["1t", "2t", "switch"]
    for arm in arms:
        on_thread(lambda a=arm: step(a))  # warm-up
    runs: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
    loads = []
    for r in range(rounds):
        order = arms[r % 3 :] + arms[: r % 3]
        order = order[::-1] if r % 2 else order
        for arm in order:
            runs[arm].append(on_thread(lambda a=arm: step(a)))
        loads.append(loadavg())
    return {
        arm: {
            "wall_s_median": statistics.median(w for w, _ in v),
            "cpu_s_median": statistics.median(c for _, c in v),
            "wall_ratio_vs_1t_per_round": [
                round(w / b[0], 3) for (w, _), b in zip(v, runs["1t"], strict=True)
            ],
        }
        for arm, v in runs.items()
    } | {"loadavg": loads, "model": model_name, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--model", choices=["tiny", "50m"], default="50m")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=80)
    args = show_defaults(parser).parse_args()
    out = {
        "torch": torch.__version__,
        "semantics": semantics(),
        "timing": timing(args.model, args.rounds, args.tokens),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
