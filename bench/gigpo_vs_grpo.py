"""GiGPO vs GRPO on the corridor task (MemoryCorridorEnv): the same tiny local model, seeds,
rollout budget and loss; only credit assignment differs. Prints JSON: success rate on held-out
episodes before and after `steps` training steps, per seed, with the mean over seeds and its 95%
confidence interval (Student t; null for one seed), and the paired GiGPO - GRPO difference (same
seeds) with its 95% interval; each run's train_mean_reward per step is null for a step whose every episode
failed (no reward). `--out FILE` also writes the JSON there.

Why the corridor: the reward is sparse (1 only for the right code at the exit, after several
moves), episodes are long relative to it (up to `max_steps` turns), and states repeat across the
episodes of a group (the env's state key is (room, seen code)), so GiGPO's anchor groups
compare actions taken from the same room: the setting where step-level credit should matter.

The tiny model is randomly initialised and knows no words, so the agent's action is read from
its completion's first character (`bucket_parser`: one of k actions by code point mod k). The
benchmark measures credit assignment on a multi-turn task with repeating states, not language.
5 seeds x 2 algorithms x 10 steps take ~15 minutes on a 2-core CPU; 30 steps ~45-60 minutes.

    python bench/gigpo_vs_grpo.py [--seeds 5] [--steps 10] [--groups-per-step 2] [--group-size 8]
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import tyro

from ludic.agents import Agent
from ludic.distributed.inprocess import InProcessPublisher
from ludic.envs.long_task import MemoryCorridorEnv
from ludic.eval import stats
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.models import TinyModelSpec, build_tiny_model
from ludic.parsers import Parser
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
    derive_seed,
    every_episode_failed,
)
from ludic.training import RLAlgorithm, RolloutBatchSource, Trainer, TrainerConfig
from ludic.training.algorithm import make_gigpo, make_grpo
from ludic.training.credit.gigpo import Combine
from ludic.types import ParseResult


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """GiGPO vs GRPO on the corridor task."""

    seeds: int = 5
    """Independent runs per algorithm (model init, rollout and eval seeds); at least 2 for an
    interval."""
    steps: int = 10
    """Training steps per run."""
    groups_per_step: int = 2
    """Problems (env seeds) per training batch."""
    group_size: int = 8
    """Episodes per problem (the GRPO / GiGPO group)."""
    eval_episodes: int = 64
    """Held-out episodes for the success rate (same env and sampling seeds for every run)."""
    length: int = 3
    """Rooms in the corridor (the last one is the exit)."""
    code_alphabet: str = "01"
    """Characters of the one-character code."""
    filler_words: int = 0
    """Filler words per room."""
    max_steps: int = 8
    """Env steps per episode."""
    max_tokens: int = 2
    """Completion tokens per model call (only the first character is read)."""
    temperature: float = 1.0
    """Sampling temperature (training and eval)."""
    lr: float = 1e-2
    """AdamW learning rate (a random tiny model needs a large one to move in a few steps)."""
    micro_batch_tokens: int = 2048
    """Token budget per forward/backward (padded rows are cheaper on CPU in small pieces)."""
    hidden_size: int = 64
    """Tiny model width (ludic.models.TinyModelSpec; 256 is the library default)."""
    num_layers: int = 2
    """Tiny model depth (4 is the library default)."""
    init_std: float = 0.02
    """Weight init std: small gives a flat random policy that explores (library default 0.1)."""
    algorithms: tuple[Literal["grpo", "gigpo"], ...] = ("grpo", "gigpo")
    """Which algorithms to run (each once)."""
    gigpo_combine: Combine = "paper"
    """GiGPO's A_E / A_S mix: paper (A_E + omega A_S) or seed003 (omega A_E + (1-omega) A_S)."""
    gigpo_omega: float | None = None
    """GiGPO omega (None: 1.0 for paper, 0.5 for seed003)."""
    out: Path | None = None
    """Also write the JSON result to this file."""
    first_seed: int = 0
    """Run seeds first_seed .. first_seed + seeds - 1 (to split one comparison over processes;
    `merge` combines their JSON files)."""

    def __post_init__(self) -> None:
        counts = ["seeds", "steps", "groups_per_step", "group_size", "eval_episodes", "length"]
        counts += ["max_steps", "max_tokens", "micro_batch_tokens", "hidden_size", "num_layers"]
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if self.first_seed < 0:
            raise ValueError(f"--first-seed must be >= 0, got {self.first_seed}")
        if not self.algorithms or len(set(self.algorithms)) < len(self.algorithms):
            raise ValueError(
                f"--algorithms must name grpo and/or gigpo once each, got {self.algorithms}"
            )


# Short, so turn samples stay short (the env's own prompt explains the actions in words).
SYSTEM_PROMPT = "Corridor. Reach the exit and give the code."


def bucket_parser(actions: Sequence[str]) -> Parser:
    """The action whose index is the first non-space character's code point mod len(actions)."""

    def parse(text: str) -> ParseResult:
        stripped = text.strip()
        if not stripped:
            return ParseResult(action=None, reward=0.0, obs="Reply with one action.")
        return ParseResult(action=actions[ord(stripped[0]) % len(actions)])

    return parse


def make_algorithm(name: str, cfg: BenchConfig) -> RLAlgorithm:
    # One loss for both, so only the credit assigner differs.
    if name == "grpo":
        return make_grpo(aggregation="token_mean")
    if name == "gigpo":
        return make_gigpo(
            aggregation="token_mean", combine=cfg.gigpo_combine, omega=cfg.gigpo_omega
        )
    raise ValueError(f"unknown algorithm {name!r}; use grpo or gigpo")


def rollout_engine(cfg: BenchConfig, client: EmbeddedEngine) -> RolloutEngine:
    actions = ["next", "back", *(f"answer {c}" for c in cfg.code_alphabet)]

    def protocol() -> SingleAgentProtocol:
        agent = Agent(
            client,
            parser=bucket_parser(actions),
            system_prompt=SYSTEM_PROMPT,
            reject_incomplete_completions=False,
        )
        return SingleAgentProtocol(agent, max_steps=cfg.max_steps)

    def corridor() -> MemoryCorridorEnv:
        return MemoryCorridorEnv(
            length=cfg.length, code_alphabet=cfg.code_alphabet, filler_words=cfg.filler_words
        )

    return RolloutEngine(
        env_registry={"corridor": corridor},
        protocol_registry={"agent": protocol},
        concurrency=64,
    )


def request(cfg: BenchConfig, **seeds: int) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="corridor"),
        protocol=ComponentSpec(name="agent"),
        sampling=SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
        **seeds,  # type: ignore[arg-type]
    )


async def success_rate(engine: RolloutEngine, cfg: BenchConfig) -> float:
    requests = [
        request(cfg, env_seed=derive_seed("eval", i), sampling_seed=derive_seed("eval-sampling", i))
        for i in range(cfg.eval_episodes)
    ]
    rollouts = await engine.run(requests)
    wins = [any(s.info.get("success") for s in r.env_steps) for r in rollouts]
    return sum(wins) / len(wins)


def run_one(cfg: BenchConfig, algorithm: str, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    spec = TinyModelSpec(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.hidden_size * 11 // 4,
        num_hidden_layers=cfg.num_layers,
        initializer_range=cfg.init_std,
    )
    model, tokenizer = build_tiny_model(seed=seed, spec=spec)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer) as client:
        engine = rollout_engine(cfg, client)
        before = asyncio.run(success_rate(engine, cfg))

        def requests_fn() -> list[RolloutRequest]:
            return [request(cfg) for _ in range(cfg.groups_per_step)]

        algo = make_algorithm(algorithm, cfg)
        source = RolloutBatchSource(
            engine=engine,
            requests_fn=requests_fn,
            credit_assigner=algo.credit_assigner,
            strategy=GRPORequestStrategy(group_size=cfg.group_size),
            seed_sequencer=SeedSequencer(run_seed=seed),
        )
        trainer = Trainer(
            model,
            algo,
            source,
            TrainerConfig(
                lr=cfg.lr,
                seed=seed,
                pad_token_id=tokenizer.pad_token_id or 0,
                micro_batch_tokens=cfg.micro_batch_tokens,
            ),
            publisher=InProcessPublisher(client),
        )
        started = time.perf_counter()
        history = trainer.run(cfg.steps, progress=False)
        seconds = time.perf_counter() - started
        after = asyncio.run(success_rate(engine, cfg))
    return {
        "seed": seed,
        "success_before": before,
        "success_after": after,
        "train_seconds": seconds,
        "train_mean_reward": train_rewards(history),
    }


def train_rewards(history: Sequence[dict[str, float]]) -> list[float | None]:
    """Each step's mean episode reward, None (JSON null) for a step with no reward: one whose
    every episode failed logs batch/mean_reward 0.0, a reward no episode earned."""
    return [
        None
        if every_episode_failed(m) or "batch/mean_reward" not in m
        else round(m["batch/mean_reward"], 4)
        for m in history
    ]


def mean_ci95(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, sample std and the 95% t interval of the mean (half width and bounds); one value
    has no interval: ci95_half is None (JSON null; NaN is not JSON)."""
    mean, half = stats.mean_ci95(values)
    if len(values) < 2:
        return {"mean": mean, "std": 0.0, "ci95_half": None, "n": len(values)}
    return {
        "mean": mean,
        "std": statistics.stdev(values),
        "ci95_half": half,
        "ci95_low": mean - half,
        "ci95_high": mean + half,
        "n": len(values),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "success_after": mean_ci95([r["success_after"] for r in runs]),
        "success_before": mean_ci95([r["success_before"] for r in runs]),
        "train_seconds_mean": statistics.fmean(r["train_seconds"] for r in runs),
    }


def paired_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, float | None]:
    """success_after of b minus a, seed by seed (both ran the same seeds)."""
    by_seed = {r["seed"]: r["success_after"] for r in a}
    return mean_ci95([r["success_after"] - by_seed[r["seed"]] for r in b])


def main(cfg: BenchConfig) -> dict[str, object]:
    """Seed by seed, every algorithm on that seed (so a stopped run still holds paired seeds);
    with --out the JSON is rewritten after every run."""
    started = time.time()
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    head = {"config": config, "started_utc": _utc(started), "machine": machine()}
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in cfg.algorithms}
    results: dict[str, Any] = {}
    for seed in range(cfg.first_seed, cfg.first_seed + cfg.seeds):
        for algorithm in cfg.algorithms:
            runs[algorithm].append(run_one(cfg, algorithm, seed))
            print(f"{algorithm} seed {seed}: {runs[algorithm][-1]}", file=sys.stderr)
            results = {**head, **report(runs), "wall_seconds": time.time() - started}
            if cfg.out is not None:
                cfg.out.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    return results


def report(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {a: {"runs": r, **summarize(r)} for a, r in runs.items() if r}
    grpo, gigpo = runs.get("grpo", []), runs.get("gigpo", [])
    # Only the seeds both ran pair (merged parts need not hold the same seeds for both).
    both = {_seed(r) for r in grpo} & {_seed(r) for r in gigpo}
    if both:
        out["gigpo_minus_grpo"] = paired_difference(
            [r for r in grpo if _seed(r) in both], [r for r in gigpo if _seed(r) in both]
        )
    return out


class MergeError(ValueError):
    """Parts that cannot be merged into one report (the message names the files and why)."""


# Settings each part may choose for itself: which seeds and algorithms it ran, where it wrote.
PER_PART_SETTINGS = ("seeds", "first_seed", "algorithms", "out")
MACHINE_SETTINGS = ("torch", "cpu", "torch_threads")
"""What of a part's `machine` must match: a seed's run differs across torch versions and CPUs."""


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """One report from the JSON files of several invocations (disjoint seeds, same config
    otherwise), e.g. `--first-seed 0 --seeds 3` and `--first-seed 3 --seeds 2`. Refuses
    (MergeError) a file that is not a part (an earlier merge's output among them), parts run
    with different settings, torch versions, CPU models or torch threads, and a seed of one algorithm in two parts."""
    parts = {Path(p): _read_part(Path(p)) for p in _distinct(paths)}
    _check_same_settings(parts)
    _check_disjoint_seeds(parts)
    algorithms = [a for a in ("grpo", "gigpo") if any(a in part for part in parts.values())]
    runs = {
        a: sorted(
            (r for part in parts.values() for r in part.get(a, {}).get("runs", [])), key=_seed
        )
        for a in algorithms
    }
    return {
        "merged_from": [str(p) for p in paths],
        "parts": [p["config"] for p in parts.values()],
        "machine": [p["machine"] for p in parts.values()],
        **report(runs),
    }


def _distinct(paths: Sequence[Path]) -> Sequence[Path]:
    seen: dict[Path, Path] = {}
    for path in paths:
        first = seen.setdefault(Path(path).resolve(), path)
        if first is not path:
            raise MergeError(
                f"{path} is given twice (as {first} and {path}): its seeds would count twice"
            )
    return paths


def _read_part(path: Path) -> dict[str, Any]:
    """A part: the JSON one invocation wrote with --out (its config, machine and runs)."""
    try:
        part = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MergeError(f"{path} is not JSON ({e}); give the files of --out") from e
    if isinstance(part, dict) and "merged_from" in part:
        sources = ", ".join(map(str, part["merged_from"]))
        raise MergeError(
            f"{path} is the output of an earlier merge (of {sources}), not a part; give only "
            "the parts' files (each invocation's --out), not it"
        )
    if not isinstance(part, dict) or "config" not in part or "machine" not in part:
        raise MergeError(
            f"{path} is not a part (no config and machine): give the files of --out of "
            "python bench/gigpo_vs_grpo.py"
        )
    return part


def _run_settings(part: dict[str, Any]) -> dict[str, Any]:
    """What must match across parts: the config less PER_PART_SETTINGS, and the torch version,
    CPU model and torch threads (each changes the numerics of a run, and its seconds)."""
    settings = {k: v for k, v in part["config"].items() if k not in PER_PART_SETTINGS}
    for key in MACHINE_SETTINGS:
        settings[f"machine.{key}"] = part["machine"].get(key)
    return settings


def _check_same_settings(parts: dict[Path, dict[str, Any]]) -> None:
    (first, first_part), *others = parts.items()
    expected = _run_settings(first_part)
    problems = []
    for path, part in others:
        settings = _run_settings(part)
        differing = [
            f"{k} {_shown(expected, k)} vs {_shown(settings, k)}"
            for k in sorted(expected.keys() | settings.keys())
            if k not in expected or k not in settings or expected[k] != settings[k]
        ]
        if differing:
            problems.append(f"{first} vs {path}: {', '.join(differing)}")
    if problems:
        raise MergeError(
            "parts run with different settings cannot be merged ("
            + "; ".join(problems)
            + "); rerun the odd parts with the same flags and OMP_NUM_THREADS, on the same CPU "
            "model and torch version"
        )


def _shown(settings: dict[str, Any], key: str) -> str:
    return repr(settings[key]) if key in settings else "(absent)"


def _check_disjoint_seeds(parts: dict[Path, dict[str, Any]]) -> None:
    owner: dict[tuple[str, int], Path] = {}
    for path, part in parts.items():
        for algorithm in ("grpo", "gigpo"):
            for run in part.get(algorithm, {}).get("runs", []):
                key = (algorithm, _seed(run))
                if key in owner:
                    where = f"both {owner[key]} and" if owner[key] != path else "twice in"
                    raise MergeError(
                        f"seed {key[1]} of {algorithm} is in {where} {path}: each seed "
                        "counts once, so give one part per seed and algorithm"
                    )
                owner[key] = path


def _seed(run: dict[str, Any]) -> int:
    return int(run["seed"])


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def machine() -> dict[str, Any]:
    """What the numbers were measured on (the CPU model, cores, load, torch)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_at_start": load,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


MERGE_USAGE = "usage: python bench/gigpo_vs_grpo.py merge A.json B.json ... (files of --out)"


def merge_paths(args: Sequence[str]) -> list[Path]:
    """The JSON files `merge` was given; exits 2 with the usage line when there are none, one is
    a flag, or one is missing."""
    problem = "no files given" if not args else None
    for arg in args:
        if problem is None and arg.startswith("-"):
            problem = f"{arg} is not a file"
        elif problem is None and not Path(arg).is_file():
            problem = f"no file {arg}"
    if problem is not None:
        print(f"{MERGE_USAGE}\nerror: {problem}", file=sys.stderr)
        raise SystemExit(2)
    return [Path(arg) for arg in args]


if __name__ == "__main__":
    if sys.argv[1:2] == ["merge"]:  # python bench/gigpo_vs_grpo.py merge a.json b.json ...
        try:
            merged = merge(merge_paths(sys.argv[2:]))
        except MergeError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        print(json.dumps(merged, indent=2, allow_nan=False))
    else:
        # tyro shows a ValueError of BenchConfig's checks as a usage error (exit 2)
        print(json.dumps(main(tyro.cli(BenchConfig)), indent=2, allow_nan=False))
