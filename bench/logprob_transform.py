"""Benchmark: the cost of recomputing logprobs under the sampling transform.

Forward + backward of `token_logprobs` on random logits [1, N, V] for the plain log-softmax,
temperature only (scale, no sort), and temperature with top-p (a sort per row, the engine's
filter), with the default chunking. Prints JSON with the median time of each and the ratio to
plain, plus peak memory on CUDA. Target: temperature alone close to plain; top-p costs a sort
per row (as the engine pays at sampling time).

    python bench/logprob_transform.py [--tokens 4096] [--vocab 151936] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from _args import show_defaults

from ludic.training.collate import TokenSampling
from ludic.training.logprobs import token_logprobs


def _sampling(n: int, temperature: float, top_p: float, device: str) -> TokenSampling:
    return TokenSampling(
        temperature_BT=torch.full((1, n), temperature, device=device),
        top_k_BT=torch.full((1, n), -1, dtype=torch.long, device=device),
        top_p_BT=torch.full((1, n), top_p, device=device),
    )


def _time(
    logits_1NV: torch.Tensor, ids_1N: torch.Tensor, sampling: TokenSampling | None, repeats: int
) -> float:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        x = logits_1NV.detach().requires_grad_(True)
        if x.is_cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        lp, _ = token_logprobs(x, ids_1N, sampling=sampling)
        lp.sum().backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    args = show_defaults(parser).parse_args()
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(1, args.tokens, args.vocab, generator=gen)
    logits_1NV = logits.to(device=args.device, dtype=getattr(torch, args.dtype))
    ids_1N = torch.randint(0, args.vocab, (1, args.tokens), generator=gen).to(args.device)
    cases = {
        "plain": None,
        "temperature_0.7": _sampling(args.tokens, 0.7, 1.0, args.device),
        "temperature_0.7_top_p_0.9": _sampling(args.tokens, 0.7, 0.9, args.device),
    }
    result: dict[str, object] = {
        "tokens": args.tokens,
        "vocab": args.vocab,
        "device": args.device,
        "dtype": args.dtype,
    }
    for name, sampling in cases.items():
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = _time(logits_1NV, ids_1N, sampling, args.repeats)
        result[f"{name}_seconds"] = round(seconds, 5)
        if args.device == "cuda":
            result[f"{name}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    plain = float(result["plain_seconds"])  # type: ignore[arg-type]
    for name in list(cases)[1:]:
        result[f"{name}_vs_plain"] = round(float(result[f"{name}_seconds"]) / plain, 2)  # type: ignore[arg-type]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
