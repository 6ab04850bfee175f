"""The TRL side of `rl_step.py`: TRL's `GRPOTrainer` on the shared workload, run in the bench-only
TRL virtualenv as a worker process and driven one step at a time over a pipe.

`python bench/trl_side.py MODEL_DIR --max-steps N --threads T` is the worker (it imports trl,
never ludic); `TrlProcess` starts it and reads each step's timings; `check_trl_python` says
how to create the virtualenv when it is missing. The workload constants and the reward live
here because both sides use them. It does not measure anything itself: `rl_step.py` does.
"""

from __future__ import annotations

import argparse
import json
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


def reward_of(text: str) -> float:
    return text.count("o") / max(1, len(text))


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
        cpu = 0.0

        def _wait(self, control: Any) -> Any:
            line = sys.stdin.readline().strip()
            if line != "go":
                control.should_training_stop = True
                return control
            watch["generation"] = 0.0
            self.released = time.perf_counter()
            self.cpu = time.process_time()
            return control

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            _send({"ready": True, "trl": trl.__version__, "optimizer": str(args.optim)})
            return self._wait(control)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
            step = time.perf_counter() - self.released
            cpu = time.process_time() - self.cpu
            _send({"step_s": step, "generation_s": watch["generation"], "cpu_s": cpu})
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
        command = [python, __file__, model_dir, "--max-steps", str(max_steps)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description="the TRL worker of bench/rl_step.py")
    parser.add_argument("model_dir")
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    trl_worker(args.model_dir, args.max_steps, args.threads)


if __name__ == "__main__":
    main()
