"""Benchmark: one GRPO step (generation + training) of Ludic against TRL's `GRPOTrainer`.

Same model (a Llama built locally by `ludic.models`, saved to a temporary directory that both
sides load; nothing comes from a model hub), same prompt ("Say something." as a user message
through the model's chat template), same reward (share of "o" characters in the reply),
2 prompts x 8 completions of exactly 64 tokens (eos ignored on both sides: Ludic's
`ignore_eos`, TRL's `min_new_tokens`), fp32, AdamW at lr 1e-4, no reference model, no gradient
checkpointing. Ludic runs as the README shows it (embedded engine, `RolloutEngine`,
`make_grpo`, `Trainer`, `InProcessPublisher`); TRL runs in its own process from a bench-only
virtualenv, driven one step at a time over a pipe so the two sides never run at once.
Steps are paired and the order swaps every pair (Ludic first, then TRL first, ...), after
warm-up steps on each side. Prints JSON: each side's median step time, their ratio (Ludic /
TRL; the target is <= 0.5), the ratio of every pair, Ludic's split (generation, training,
weight copy) and TRL's generation time, with the machine load before and after.

TRL is never a dependency of Ludic. Create its virtualenv once (same torch as Ludic's):

    python3 -m venv /work/venv-trl && /work/venv-trl/bin/pip install torch==2.13.0 trl

then, from Ludic's environment:

    python bench/rl_step.py [--model tiny|50m] [--pairs 8] [--warmup 2]
                            [--trl-python /work/venv-trl/bin/python]  # or $LUDIC_TRL_PYTHON

It does not compare learning (rewards of a few steps are noise), only time per step.
On a machine shared with other jobs pass `--threads 1`: with 2 torch threads per side under
load, TRL's steps stalled at 18-99 s each (also when run alone) while Ludic's took ~2 s.
`--overlap` is a different algorithm from TRL's step (one policy version off-policy); report
it beside the synchronous ratio, not instead of it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS, GROUP_SIZE, COMPLETION_TOKENS, LR = 2, 8, 64, 1e-4
PROMPT_TEXT = "Say something."
PROTOCOL_PREFIX = "@@rl_step "
DEFAULT_TRL_PYTHON = "/work/venv-trl/bin/python"
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


def reward_of(text: str) -> float:
    return text.count("o") / max(1, len(text))


# -- the TRL side (runs in the TRL virtualenv: no ludic imports here) ------------------------


def trl_worker(model_dir: str, max_steps: int, threads: int) -> None:
    """Train with TRL's GRPOTrainer, one step per "go" line on stdin; after each step print
    its seconds (from the "go" to the end of the optimizer step) and its generation seconds."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": PROMPT_TEXT}]] * (PROMPTS * (max_steps + 2))}
    )

    def reward(completions: list[Any], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward_of(t) for t in texts]

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        per_device_train_batch_size=PROMPTS * GROUP_SIZE,
        num_generations=GROUP_SIZE,
        max_completion_length=COMPLETION_TOKENS,
        generation_kwargs={"min_new_tokens": COMPLETION_TOKENS},
        learning_rate=LR,
        lr_scheduler_type="constant",
        beta=0.0,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        max_steps=max_steps,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    watch = {"generation": 0.0}

    class Driven(TrainerCallback):
        """Waits for "go" before each step and reports the step's time after it."""

        released = 0.0

        def _wait(self, control: Any) -> Any:
            line = sys.stdin.readline().strip()
            if line != "go":
                control.should_training_stop = True
                return control
            watch["generation"] = 0.0
            self.released = time.perf_counter()
            return control

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            _send({"ready": True, "trl": trl.__version__, "optimizer": str(args.optim)})
            return self._wait(control)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            step = time.perf_counter() - self.released
            _send({"step_s": step, "generation_s": watch["generation"]})
            return self._wait(control)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Driven()],
    )
    generate = trainer._generate

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            watch["generation"] += time.perf_counter() - started

    trainer._generate = timed_generate  # type: ignore[method-assign]
    trainer.train()
    _send({"finished": True})


def _send(message: dict[str, Any]) -> None:
    print(PROTOCOL_PREFIX + json.dumps(message), flush=True)


class TrlProcess:
    """The TRL worker as a subprocess: `step()` runs one step and returns its timings."""

    def __init__(self, python: str, model_dir: str, max_steps: int, threads: int) -> None:
        command = [python, __file__, "--trl-worker", model_dir, "--max-steps", str(max_steps)]
        command += ["--threads", str(threads)]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.info = self._receive()

    def _receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL_PREFIX):
                message: dict[str, Any] = json.loads(line[len(PROTOCOL_PREFIX) :])
                return message
        raise RuntimeError(
            f"the TRL worker exited (code {self.proc.wait()}) before answering; its stderr "
            "above says why"
        )

    def step(self) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._receive()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def check_trl_python(python: str) -> None:
    """A clear error unless `python` runs and imports trl."""
    if not Path(python).exists():
        raise SystemExit(
            f"no python at {python} for the TRL side. Create the bench-only virtualenv:\n"
            "  python3 -m venv /work/venv-trl && /work/venv-trl/bin/pip install torch==2.13.0 trl\n"
            "and pass --trl-python (or set LUDIC_TRL_PYTHON) if it lives elsewhere."
        )
    probe = subprocess.run(
        [python, "-c", "import trl, torch, transformers; print(torch.__version__)"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise SystemExit(
            f"{python} cannot import trl ({probe.stderr.strip().splitlines()[-1:]}); install "
            "it there: <venv>/bin/pip install torch==2.13.0 trl"
        )


# -- the Ludic side -------------------------------------------------------------------------


class LudicSide:
    """Ludic's GRPO loop as the README writes it; `step()` runs one Trainer step."""

    def __init__(self, model_dir: str, overlap: bool = False) -> None:
        import asyncio
        import copy

        from ludic.agents import Agent
        from ludic.distributed import InProcessPublisher
        from ludic.envs.single_agent import SingleAgentEnv
        from ludic.inference import EmbeddedEngine, SamplingConfig
        from ludic.interaction import SingleAgentProtocol
        from ludic.models import load_model
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

        model, tokenizer = load_model(model_dir, dtype="float32")
        self.engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
        sampling = SamplingConfig(max_tokens=COMPLETION_TOKENS, extras={"ignore_eos": True})
        rollouts = RolloutEngine(
            env_registry={"say_o": SayOEnv},
            protocol_registry={
                "single": lambda: SingleAgentProtocol(
                    Agent(self.engine, sampling=sampling, reject_incomplete_completions=False),
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
        config = TrainerConfig(
            lr=LR, pad_token_id=int(tokenizer.pad_token_id), max_lag=1 if overlap else None
        )
        self.prefetch = PrefetchBatchSource(source) if overlap else None
        self.trainer = Trainer(
            model,
            algorithm,
            self.prefetch or source,
            config,
            publisher=InProcessPublisher(self.engine),
        )
        self.parameters = sum(p.numel() for p in model.parameters())
        self._loop = asyncio.new_event_loop()

    def step(self) -> dict[str, float]:
        started = time.perf_counter()
        metrics = self._loop.run_until_complete(self.trainer.train_step())
        if self.prefetch is not None:  # the next batch's generation counts in this step
            self.prefetch.wait()
        return {
            "step_s": time.perf_counter() - started,
            "generation_s": metrics["time/batch_seconds"],
            "training_s": metrics.get("time/train_seconds", float("nan")),
            "weight_copy_s": metrics.get("time/publish_seconds", float("nan")),
            "completion_tokens": metrics["num_action_tokens"],
            "dropped_stale": metrics.get("dropped_stale", 0.0),
        }

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.close()
        self.engine.close()
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


def run_pairs(
    ludic: LudicSide, trl: TrlProcess, pairs: int, warmup: int
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    for _ in range(warmup):
        ludic.step()
        trl.step()
    ludic_runs, trl_runs = [], []
    for i in range(pairs):
        if i % 2 == 0:
            ludic_runs.append(ludic.step())
            trl_runs.append(trl.step())
        else:
            trl_runs.append(trl.step())
            ludic_runs.append(ludic.step())
    return ludic_runs, trl_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODEL_SPECS), default="tiny")
    parser.add_argument("--pairs", type=int, default=8, help="measured step pairs")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps per side")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="Ludic generates the next batch while it trains (PrefetchBatchSource, max_lag=1): "
        "one policy version off-policy, unlike TRL's synchronous step",
    )
    parser.add_argument(
        "--trl-python",
        default=os.environ.get("LUDIC_TRL_PYTHON", DEFAULT_TRL_PYTHON),
        help="python of the bench-only TRL virtualenv (default: $LUDIC_TRL_PYTHON or "
        f"{DEFAULT_TRL_PYTHON})",
    )
    parser.add_argument("--trl-worker", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--max-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args.trl_worker, args.max_steps, args.threads)
        return
    check_trl_python(args.trl_python)
    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="rl-step-model-") as model_dir:
        save_model_dir(args.model, model_dir)
        steps = args.pairs + args.warmup
        trl = TrlProcess(args.trl_python, model_dir, steps + 1, args.threads)
        ludic = LudicSide(model_dir, overlap=args.overlap)
        try:
            ludic_runs, trl_runs = run_pairs(ludic, trl, args.pairs, args.warmup)
        finally:
            ludic.close()
            trl.close()
    ludic_median, trl_median = median_of(ludic_runs, "step_s"), median_of(trl_runs, "step_s")
    report = {
        "benchmark": "rl_step",
        "workload": {
            "model": args.model,
            "model_parameters": ludic.parameters,
            "prompts": PROMPTS,
            "group_size": GROUP_SIZE,
            "completion_tokens": COMPLETION_TOKENS,
            "dtype": "float32",
            "optimizer": "AdamW",
            "lr": LR,
            "reference_model": False,
            "ludic_overlap": args.overlap,
        },
        "ratio_of_medians": ludic_median / trl_median,
        "target": "ratio_of_medians <= 0.5",
        "pair_ratios": [
            lr["step_s"] / tr["step_s"] for lr, tr in zip(ludic_runs, trl_runs, strict=True)
        ],
        "ludic_median": {k: median_of(ludic_runs, k) for k in ludic_runs[0]},
        "trl_median": {k: median_of(trl_runs, k) for k in trl_runs[0]},
        "ludic_runs": ludic_runs,
        "trl_runs": trl_runs,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.info.get("trl"),
            "trl_optimizer": trl.info.get("optimizer"),
        },
        "torch_threads": torch.get_num_threads(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "pairs": args.pairs,
        "warmup_steps": args.warmup,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
