"""Benchmark: one GRPO step (generation + training) of Ludic against TRL's `GRPOTrainer`.

Same model (a Llama built locally by `ludic.models`, saved to a temporary directory that every
side loads; nothing comes from a model hub), same prompt ("Say something." as a user message
through the model's chat template), same reward (share of "o" characters in the reply),
2 prompts x 8 completions of exactly 64 tokens (eos ignored on both sides: Ludic's
`ignore_eos`, TRL's `min_new_tokens`), fp32, AdamW at lr 1e-4, no reference model, no gradient
checkpointing. TRL runs in its own process from a bench-only virtualenv, driven one step at a
time over a pipe (`trl_side.py`: the worker, the workload constants and the reward).

Arms (each steps once per round; the order rotates every round and reverses every other
round; warm-up steps first; no two arms ever run at once):
- `ludic_sync`: as the README shows it (embedded engine, `RolloutEngine`, `make_grpo`,
  `Trainer`, `InProcessPublisher`): generate, then train, in one process.
- `ludic_thread`: the same with `PrefetchBatchSource` (max_lag=1): the next batch is generated
  on a thread of the same process while this one trains (one policy version off-policy).
- `ludic_process`: the README's "Generation in another process": `ludic serve` in a child
  process (`LocalServer`, `--server-threads` torch threads), `make_inference`'s HTTP client
  and `BroadcastPolicyPublisher` (verified push after every step), `PrefetchBatchSource`,
  max_lag=1. The trainer keeps `--threads` torch threads.
- `trl_<N>t`: TRL with N torch threads, one arm per entry of `--trl-threads`.
An overlapped arm's step also waits until the next batch is generated, so its time is what a
step costs in a long run and its generation never runs beside another arm's step.

Prints JSON: every Ludic arm's median step time against every TRL arm's (ratio of medians and
each round's ratio) and against the faster TRL arm (the target: <= 0.5), each arm's median
split (generation, time waited for it, training, weight sync, policy lag), every step, the
round orders and the load average after each round. Also CPU seconds per step: `cpu_s`
(every process of the arm), `busiest_process_cpu_s` (the most any one process of the arm used:
the trainer or the server), and `cpu_ratio_vs_trl_1t` = a Ludic arm's busiest process's CPU
time over TRL's one-thread step's CPU time: what the wall-time ratio tends to on an idle
machine with a core per process (one torch thread each), read on a busy one where wall time is
not. It is an estimate; the wall-time ratios are the measurement.

TRL is never a dependency of Ludic. Create its virtualenv once (same torch as Ludic's):

    python3 -m venv /work/venv-trl && /work/venv-trl/bin/pip install torch==2.13.0 trl

then, from Ludic's environment:

    python bench/rl_step.py [--model tiny|50m] [--rounds 8] [--warmup 2]
        [--ludic sync,thread,process] [--threads 1] [--server-threads 1]
        [--trl-threads 1,2] [--trl-python /work/venv-trl/bin/python]  # or $LUDIC_TRL_PYTHON

It does not compare learning (rewards of a few steps are noise), only time per step. On a
machine busy with other jobs, every arm that uses more than one core (TRL with 2 threads,
Ludic's process arm) loses what it would gain on an idle one; TRL with 2 threads has stalled at
18-99 s per step there. Say which load each number was measured at.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _args import non_negative_int, positive_int, positive_int_list, show_defaults
from _machine import measured_on
from trl_side import (
    COMPLETION_TOKENS,
    DEFAULT_TRL_PYTHON,
    GROUP_SIZE,
    LR,
    PROMPT_TEXT,
    PROMPTS,
    TrlProcess,
    check_trl_python,
    reward_of,
)

# name -> TinyModelSpec fields (the tiny default is about 3M parameters)
MODEL_SPECS: dict[str, dict[str, int]] = {
    "tiny": {},
    "50m": {
        "hidden_size": 768,
        "intermediate_size": 1920,
        "num_hidden_layers": 8,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
    },
}


# -- the Ludic side -------------------------------------------------------------------------

LUDIC_MODES = ("sync", "thread", "process")
# optional suffixes of a Ludic arm: "_packed" (the engine, in-process or `ludic serve --prepacked-gemm`), "_shared", "_compile",
# "_fused", "_lend" (overlapped arms only)
LUDIC_OPTIONS = ("packed", "shared", "compile", "fused", "lend")


def ludic_arm(name: str) -> tuple[str, set[str]]:
    """`thread_packed_shared` -> ("thread", {"packed", "shared"}); exits on a bad name."""
    mode, *options = name.split("_")
    bad = [o for o in options if o not in LUDIC_OPTIONS]
    if mode not in LUDIC_MODES or bad or (mode == "sync" and "lend" in options):
        raise SystemExit(
            f"unknown Ludic arm {name!r}: a mode of {list(LUDIC_MODES)} with optional suffixes "
            f"{['_' + o for o in LUDIC_OPTIONS]} (_lend not with sync)"
        )
    return mode, set(options)


class LudicSide:
    """Ludic's GRPO loop as the README writes it; `step()` runs one Trainer step.

    `mode`: "sync" (embedded engine in this process, `InProcessPublisher`), "thread" (the same
    with `PrefetchBatchSource`, max_lag=1: the next batch is generated on a thread while this
    one trains) or "process" (`ludic serve` in a child process via `LocalServer`, the HTTP
    client and `BroadcastPolicyPublisher` from `make_inference`, `PrefetchBatchSource`,
    max_lag=1). Suffix "_packed": `EngineConfig(prepacked_gemm=True)` (process: `--prepacked-gemm`; the
    engine's GEMMs on packed weight copies: faster, rounds differently from the trainer's
    forward); "_shared": `TrainerConfig(shared_prefix=True)` (a group's prompt once in the
    training forward); "_compile": `TrainerConfig(compile=True)` (MLPs and norms compiled; the
    compile falls in the warm-up steps); "_fused": `TrainerConfig(fused_adamw=True)`; "_lend"
    (thread, process): `PrefetchBatchSource(lend_idle_threads=True)` (once the next batch is
    drawn the trainer takes every CPU's thread until the step ends). An overlapped step also
    waits for the next batch, so no generation runs while
    the other side's step does: its time is what a step costs in a long run."""

    def __init__(
        self, model_dir: str, mode: str = "sync", threads: int = 1, server_threads: int = 1
    ) -> None:
        import asyncio

        import torch

        from ludic.models import load_model

        self.mode, options = ludic_arm(mode)
        self.threads = threads
        self.prepacked, self.shared_prefix = "packed" in options, "shared" in options
        self.compile, self.fused_adamw = "compile" in options, "fused" in options
        self.lend = "lend" in options
        self.server = None
        self._loop = asyncio.new_event_loop()
        torch.set_num_threads(threads)
        model, tokenizer = load_model(model_dir, dtype="float32")
        client, publisher, self._closers = self._inference(
            model, tokenizer, model_dir, server_threads
        )
        self.client, self.prefetch = client, None
        self.trainer = self._trainer(model, tokenizer, client, publisher)
        self.parameters = sum(p.numel() for p in model.parameters())

    def _inference(
        self, model: Any, tokenizer: Any, model_dir: str, server_threads: int
    ) -> tuple[Any, Any, list[Any]]:
        if self.mode != "process":
            import copy

            from ludic.distributed import InProcessPublisher
            from ludic.inference import EmbeddedEngine
            from ludic.inference.embedded.engine_config import EngineConfig

            config = EngineConfig(prepacked_gemm=self.prepacked)
            engine = EmbeddedEngine(copy.deepcopy(model), tokenizer, config=config)
            return engine, InProcessPublisher(engine), [engine.close]
        from ludic.inference.http.local_server import LocalServer
        from ludic.recipes.inference import make_inference

        packed = ("--prepacked-gemm",) if self.prepacked else ()
        self.server = LocalServer(model_dir, threads=server_threads, args=packed).start()
        inference = make_inference(
            model, tokenizer, server_url=self.server.url, server_token=self.server.token
        )
        assert inference.publisher is not None
        return inference.client, inference.publisher, [inference.publisher.close]

    def _trainer(self, model: Any, tokenizer: Any, client: Any, publisher: Any) -> Any:
        from ludic.agents import Agent
        from ludic.envs.single_agent import SingleAgentEnv
        from ludic.inference import SamplingConfig
        from ludic.interaction import SingleAgentProtocol
        from ludic.rollouts import (
            ComponentSpec,
            GRPORequestStrategy,
            RolloutEngine,
            RolloutRequest,
            SeedSequencer,
        )
        from ludic.training import (
            PrefetchBatchSource,
            RolloutBatchSource,
            Trainer,
            TrainerConfig,
            make_grpo,
        )
        from ludic.types import StepOutcome

        class SayOEnv(SingleAgentEnv):
            def env_reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
                return PROMPT_TEXT, {}

            def env_step(self, action: str) -> StepOutcome:
                return StepOutcome(obs="", reward=reward_of(action), terminated=True)

        sampling = SamplingConfig(max_tokens=COMPLETION_TOKENS, extras={"ignore_eos": True})
        rollouts = RolloutEngine(
            env_registry={"say_o": SayOEnv},
            protocol_registry={
                "single": lambda: SingleAgentProtocol(
                    Agent(client, sampling=sampling, reject_incomplete_completions=False),
                    max_steps=1,
                )
            },
        )
        algorithm = make_grpo()
        problem = RolloutRequest(
            env=ComponentSpec(name="say_o"), protocol=ComponentSpec(name="single")
        )
        source = RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: [problem] * PROMPTS,
            credit_assigner=algorithm.credit_assigner,
            strategy=GRPORequestStrategy(group_size=GROUP_SIZE),
            seed_sequencer=SeedSequencer(run_seed=0),
        )
        overlap = self.mode != "sync"
        config = TrainerConfig(
            lr=LR,
            pad_token_id=int(tokenizer.pad_token_id),
            max_lag=1 if overlap else None,
            shared_prefix=self.shared_prefix,
            compile=self.compile,
            fused_adamw=self.fused_adamw,
        )
        self.prefetch = (
            PrefetchBatchSource(source, lend_idle_threads=self.lend) if overlap else None
        )
        return Trainer(model, algorithm, self.prefetch or source, config, publisher=publisher)

    def step(self) -> dict[str, float]:
        import torch

        torch.set_num_threads(self.threads)
        server_cpu = self._server_cpu()
        cpu = time.process_time()
        started = time.perf_counter()
        metrics = self._loop.run_until_complete(self.trainer.train_step())
        waited = metrics["time/batch_seconds"]
        if self.prefetch is not None:  # the next batch's generation counts in this step
            before = time.perf_counter()
            self.prefetch.wait()
            waited += time.perf_counter() - before
        step = time.perf_counter() - started
        cpu = time.process_time() - cpu
        server_cpu = self._server_cpu() - server_cpu
        generation = metrics.get("batch/prefetch_draw_seconds", metrics["time/batch_seconds"])
        return {
            "step_s": step,
            "cpu_s": cpu + server_cpu,  # every process of this arm, all threads
            # what one step needs of the busiest process: on an idle machine with a core for
            # each process, the step cannot be shorter (the critical path's CPU time)
            "busiest_process_cpu_s": max(cpu, server_cpu),
            "server_cpu_s": server_cpu,
            "generation_s": generation,
            "waited_for_generation_s": waited,
            "training_s": metrics.get("time/train_seconds", float("nan")),
            # the step before this one: seconds from its lend to this step's draw (here they
            # include the other arms' steps in between) and whether the lend was dropped
            "lent_threads_s": metrics.get("batch/prefetch_lent_seconds", 0.0),
            "lend_dropped": metrics.get("batch/prefetch_lend_dropped", 0.0),
            "weight_sync_s": metrics.get("time/publish_seconds", float("nan")),
            "completion_tokens": metrics["num_action_tokens"],
            "policy_lag_mean": metrics.get("policy_lag/mean", float("nan")),
            "dropped_stale": metrics.get("dropped_stale", 0.0),
        }

    def _server_cpu(self) -> float:
        """CPU seconds (user + system) the server child has used so far; 0 without one."""
        if self.server is None or self.server.process is None:
            return 0.0
        fields = Path(f"/proc/{self.server.process.pid}/stat").read_text().rsplit(")", 1)[1]
        utime, stime = fields.split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.prefetch is not None:  # the process arm's HTTP client is bound to its loop
            self.prefetch.close(*([self.client] if self.mode == "process" else []))
        for close in self._closers:
            close()
        if self.server is not None:
            self.server.close()
        self._loop.close()


# -- driver ---------------------------------------------------------------------------------


def save_model_dir(name: str, root: str) -> str:
    from ludic.models import TinyModelSpec, build_tiny_model, save_model

    model, tokenizer = build_tiny_model(seed=0, spec=TinyModelSpec(**MODEL_SPECS[name]))
    save_model(model, tokenizer, root)
    return root


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


Arm = LudicSide | TrlProcess


def run_rounds(
    arms: dict[str, Arm], rounds: int, warmup: int
) -> tuple[dict[str, list[dict[str, float]]], list[list[str]], list[list[float]]]:
    """Every arm steps once per round; the order rotates each round and reverses every other
    round, so each arm runs in every position and after every other arm. Returns each arm's
    measured steps, each round's order and the load average after each round."""
    names = list(arms)
    for _ in range(warmup):
        for name in names:
            arms[name].step()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    orders, loads = [], []
    for r in range(rounds):
        shift = r % len(names)
        order = names[shift:] + names[:shift]
        if (r // len(names)) % 2:
            order.reverse()
        for name in order:
            runs[name].append(arms[name].step())
        orders.append(order)
        loads.append(loadavg())
    return runs, orders, loads


def parse_list(text: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise SystemExit(f"empty list: {text!r}")
    bad = [v for v in values if allowed is not None and v not in allowed]
    if bad:
        raise SystemExit(f"unknown value(s) {bad}; choose from {list(allowed or ())}")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:  # one arm per name: a second would replace the first, left running
        raise SystemExit(f"{twice} given twice in {text!r}: name each arm once")
    return values


def comparisons(
    runs: dict[str, list[dict[str, float]]], ludic: list[str], trl: list[str]
) -> dict[str, Any]:
    """Ratio of median step times of every Ludic arm against every TRL arm, each round's
    ratio, and each Ludic arm against the faster TRL arm (the target's yardstick)."""
    medians = {name: median_of(r, "step_s") for name, r in runs.items()}
    fastest_trl = min(trl, key=lambda name: medians[name])
    ratios: dict[str, Any] = {}
    for lu in ludic:
        for tr in trl:
            ratios[f"{lu} / {tr}"] = {
                "ratio_of_medians": medians[lu] / medians[tr],
                "round_ratios": [
                    a["step_s"] / b["step_s"] for a, b in zip(runs[lu], runs[tr], strict=True)
                ],
            }
    one_thread = [tr for tr in trl if tr == "trl_1t"]
    cpu_bound: dict[str, float] = {}
    if one_thread:  # a one-thread step's CPU time is its time on an idle core
        trl_cpu = median_of(runs[one_thread[0]], "cpu_s")
        for lu in ludic:
            cpu_bound[lu] = median_of(runs[lu], "busiest_process_cpu_s") / trl_cpu
    return {
        "fastest_trl": fastest_trl,
        "ratio_vs_fastest_trl": {lu: medians[lu] / medians[fastest_trl] for lu in ludic},
        "ratios": ratios,
        "cpu_ratio_vs_trl_1t": cpu_bound,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODEL_SPECS), default="tiny")
    parser.add_argument("--rounds", "--pairs", type=positive_int, default=8, help="measured rounds")
    parser.add_argument(
        "--warmup", type=non_negative_int, default=2, help="unmeasured steps per arm"
    )
    parser.add_argument(
        "--ludic",
        default="sync,process",
        help="Ludic arms, comma-separated: sync (generate, then train), thread (next batch "
        "generated on a thread while training, max_lag=1), process (next batch generated by "
        "ludic serve in a child process while training, max_lag=1); suffixes: _packed "
        "(EngineConfig(prepacked_gemm=True); process: ludic serve --prepacked-gemm), _shared "
        "(TrainerConfig(shared_prefix=True)), _compile (TrainerConfig(compile=True)), _fused "
        "(TrainerConfig(fused_adamw=True)), _lend (PrefetchBatchSource(lend_idle_threads=True), "
        "thread and process only), e.g. thread_packed_shared_compile_fused",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads of Ludic's trainer process"
    )
    parser.add_argument(
        "--server-threads",
        type=positive_int,
        default=1,
        help="torch threads of the process arm's server",
    )
    parser.add_argument(
        "--trl-threads",
        type=positive_int_list,
        default=[1, 2],
        help="TRL arms, one per torch thread count, comma-separated (each its own process)",
    )
    parser.add_argument(
        "--trl-python",
        default=os.environ.get("LUDIC_TRL_PYTHON", DEFAULT_TRL_PYTHON),
        help="python of the bench-only TRL virtualenv (default: $LUDIC_TRL_PYTHON or "
        f"{DEFAULT_TRL_PYTHON})",
    )
    args = show_defaults(parser).parse_args()
    ludic_modes = parse_list(args.ludic)
    for name in ludic_modes:
        ludic_arm(name)
    trl_threads: list[int] = args.trl_threads
    check_trl_python(args.trl_python)
    import torch
    import transformers

    load_before = os.getloadavg()
    arms: dict[str, Arm] = {}
    with tempfile.TemporaryDirectory(prefix="rl-step-model-") as model_dir:
        save_model_dir(args.model, model_dir)
        steps = args.rounds + args.warmup
        try:
            for threads in trl_threads:
                arms[f"trl_{threads}t"] = TrlProcess(args.trl_python, model_dir, steps + 1, threads)
            for mode in ludic_modes:
                arms[f"ludic_{mode}"] = LudicSide(
                    model_dir, mode, threads=args.threads, server_threads=args.server_threads
                )
            runs, orders, loads = run_rounds(arms, args.rounds, args.warmup)
        finally:
            for arm in arms.values():
                arm.close()
    ludic_names = [f"ludic_{m}" for m in ludic_modes]
    trl_names = [f"trl_{t}t" for t in trl_threads]
    first_ludic = arms[ludic_names[0]]
    assert isinstance(first_ludic, LudicSide)
    first_trl = arms[trl_names[0]]
    assert isinstance(first_trl, TrlProcess)
    report = {
        "benchmark": "rl_step",
        "workload": {
            "model": args.model,
            "model_parameters": first_ludic.parameters,
            "prompts": PROMPTS,
            "group_size": GROUP_SIZE,
            "completion_tokens": COMPLETION_TOKENS,
            "dtype": "float32",
            "optimizer": "AdamW",
            "lr": LR,
            "reference_model": False,
        },
        "target": "Ludic / TRL median step time <= 0.5 (against TRL's faster thread count)",
        **comparisons(runs, ludic_names, trl_names),
        "medians": {name: {k: median_of(r, k) for k in r[0]} for name, r in runs.items()},
        "threads": {
            "ludic_trainer": args.threads,
            "ludic_server": args.server_threads
            if any(m.startswith("process") for m in ludic_modes)
            else None,
            "trl": trl_threads,
        },
        "runs": runs,
        "round_orders": orders,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": first_trl.info.get("trl"),
            "trl_optimizer": first_trl.info.get("optimizer"),
        },
        "machine": platform.machine(),
        "measured_on": measured_on(load_before),  # the CPU model: platform's is x86_64
        "loadavg_per_round": loads,
        "rounds": args.rounds,
        "warmup_steps": args.warmup,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
