"""AWR vs rejection-sampled SFT on tic-tac-toe data, from the same model, at the same budget.

    python examples/awr_tictactoe.py                                  # the quickstart's data
    python examples/awr_tictactoe.py --expert-epsilons 0 0.5 1        # mixed-quality players
    python examples/awr_tictactoe.py --self-episodes 512              # + the SFT'd model's games
    python examples/awr_tictactoe.py --expert-epsilons 0 0.5 1 --baseline value --beta 1 \
        --max-weight 3 --awr-games kept --normalize-mean --min-weight 0.5  # filter, reweight
    python examples/awr_tictactoe.py --expert-epsilons 0 0.5 1 --baseline q_value \
        --features board --beta 0.5 --max-weight 3 --awr-games kept --normalize-mean \
        --min-weight 0.5 --seeds 12                                   # learned Q - V
    python examples/awr_tictactoe.py --expert-epsilons 0 1 1 1 1 1 1 1 --baseline q_value \
        --features board --beta 0.5 --max-weight 3 --awr-games kept --normalize-mean \
        --min-weight 0.5 --seeds 12              # 1/8 minimax games: AWR wins more (README)
    python examples/awr_tictactoe.py --expert-epsilons 0 1 1 1 1 1 1 1 --baseline q_value \
        --features board --beta 0.5 --max-weight 3 --awr-games kept --normalize-mean \
        --min-weight 0.5 --steps 600 --seeds 12  # and 600 steps: no more illegal moves (README)

Everything is the quickstart's (`ludic quickstart`): the tiny model with the task tokenizer, the
compact board, an illegal move costs -1 and the agent tries again, SFT at lr 3e-3 on batches of
64 turns, 128 evaluation games against the random opponent at temperature 1 (the same opponent
seeds for every run), one torch thread. Per seed:

  data: scripted players (`expert_policy`, one share of the games per `--expert-epsilons`
        value) play `--expert-episodes` games; every game is stored (`expert/all.jsonl`) and
        its wins and draws (`expert/kept.jsonl`);
  sft:  rejection-sampled SFT, as the quickstart: the kept games, penalised (illegal) turns left
        out, weight 1;
  awr:  every game, penalised turns left out of the loss (their penalties stay in the returns),
        each turn weighted by min(exp(A / beta), max_weight) (`make_awr`, `--baseline`);
        with `--awr-games kept` only the games sft trains on (weights from every game).

With `--self-episodes N` the comparison is a second stage: the model first gets the
quickstart's SFT (`--steps` on the kept expert games, shared by both methods), then plays N
games of its own at temperature 1 (illegal and unparseable moves, losses and all); from that
model, sft and awr each train `--continue-steps` on the expert games plus its own (sft: the
kept ones). The stage-1 model is evaluated too ("start" rows).

Prints the evaluations, mean and 95% t-interval per method (win and illegal-move rates in
percent) and for the paired difference (in percentage points), and how the weights treat
optimal, other legal and illegal moves; writes `results.json`. Calls into one `--out-dir`
merge (other seeds with `--first-seed`, other methods with `--methods`): each seed's runs and
data are kept in `seed_N/` (its games written once, by the first call that plays them) and
`results.json` summarises every seed there; a call with other settings is refused. With
`--self-episodes N > 0` methods cannot be split over calls (a seed's start run exists).
Which turns AWR trains on, the board features and that weight report are in
`awr_tictactoe_weights.py`, beside this file.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import tyro
from rich.console import Console

from ludic.eval.stats import mean_ci95
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.sampling import SamplingConfig
from ludic.models import TinyModelSpec, build_tiny_model, load_model, save_model
from ludic.recipes import finish, make_trainer, refuse_earlier_checkpoints
from ludic.recipes.expert import PolicyClient
from ludic.recipes.tictactoe import (
    ENV_NAME,
    PROTOCOL_NAME,
    StageResult,
    drop_penalised_turns,
    evaluate_stage,
    expert_policy,
    print_results,
    rollout_engine,
    task_tokenizer,
)
from ludic.rollouts import (
    ComponentSpec,
    RolloutRequest,
    SampleFilter,
    SeedSequencer,
    derive_seed,
    read_rollouts_jsonl,
    write_rollouts_jsonl,
)
from ludic.training import AWRCredit, OfflineBatchSource, RLAlgorithm, make_awr, make_sft
from ludic.training.credit.awr import UnreadAWROptionError, check_baseline_options
from ludic.types import Rollout

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # `python examples/awr_tictactoe.py` has it; a load by path may not
    sys.path.append(_HERE)
from awr_tictactoe_weights import (  # noqa: E402, F401  (tests read them all here)
    afterstate_features,
    baseline_r2,
    board_features,
    board_featurizers,
    canonical,
    cell_features,
    move_weights,
    trained_by,
    won_or_drew,
)

METHODS: tuple[Literal["sft", "awr"], ...] = ("sft", "awr")
MAX_TOKENS = 10  # as the quickstart


@dataclass(frozen=True, kw_only=True, slots=True)
class AWRConfig:
    """AWR on every game vs SFT on the won or drawn ones (see the module docstring)."""

    expert_episodes: int = 1000
    """Games the scripted players play in all (split over --expert-epsilons, the first
    players playing one more when it does not divide)."""
    expert_epsilons: tuple[float, ...] = (0.0,)
    """Random-move probability of each scripted player (0: minimax, the quickstart's expert);
    each plays an equal share of the games, so repeating a value sets shares (`0 1 1 1`: one
    minimax game in four, the rest random)."""
    expert_taken: float = 0.0
    """Probability that a scripted player names an occupied cell (an illegal move, -1)."""
    self_episodes: int = 0
    """0: train both methods from the fresh model. N > 0: from the quickstart's SFT model, on
    the expert games plus N of its own games (see the module docstring)."""
    opponent: Literal["random", "minimax", "mixed"] = "random"
    """Scripted opponent of the data and of the evaluations."""
    steps: int = 300
    """Optimizer steps of each run (with --self-episodes: of the shared stage-1 SFT)."""
    continue_steps: int = 100
    """With --self-episodes: optimizer steps of each method's second stage."""
    batch_size: int = 64
    """Samples (turns) per step."""
    lr: float = 3e-3
    """Learning rate (the quickstart's SFT)."""
    beta: float = 0.5
    """AWR temperature."""
    max_weight: float = 20.0
    """AWR weight cap."""
    baseline: Literal["group", "mean", "state", "state_action", "value", "q_value"] = "state"
    """AWR baseline: group (episode return minus its group's mean), mean (return-to-go minus
    the data's mean), state (minus the other visits of the turn's board), state_action
    (Q(board, move) - V(board), each the mean return-to-go of its visits), value (minus a
    tiny MLP's value of the board, cross-fitted over --value-folds folds of games) or q_value
    (Q(board, move) - V(board), both tiny MLPs fitted as value's; see --features)."""
    features: Literal["text", "board"] = "text"
    """What the value models of --baseline value / q_value see: text (the library's default:
    the observation's characters by position, and for Q the move) or board (the cells of the
    board up to its 8 symmetries, and for Q those of the board the move leads to, its
    afterstate, which the (board, move) pairs that reach one position share)."""
    value_folds: int = 5
    """With baseline value or q_value: folds of games (each game's value is fitted on the
    others)."""
    state_prior: float = 1.0
    """With baseline state or state_action: pseudo-visits of the parent mean per estimate."""
    state_normalize: bool = False
    """Divide each AWR weight by the mean weight of its board's turns (every board keeps its
    share of the data; only the choice of move is reweighted)."""
    normalize_mean: bool = False
    """Divide the AWR weights by their mean over the trained turns (mean weight 1, as SFT)."""
    min_weight: float = 0.0
    """Floor of the AWR weights, applied last (with --normalize-mean: a share of the mean)."""
    awr_games: Literal["all", "kept"] = "all"
    """Games AWR trains on: all, or kept (the won and drawn ones, as SFT: filter then
    reweight; the weights are computed on every game either way)."""
    eval_episodes: int = 128
    """Evaluation games per run (the same opponent seeds for every run)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluated policy."""
    hidden_size: int = 128
    """Tiny model width (as the quickstart)."""
    num_layers: int = 2
    """Tiny model depth (as the quickstart)."""
    seeds: int = 3
    """Repeat everything (model, tokenizer, data, training) with seeds first_seed, ...."""
    first_seed: int = 0
    """The first seed (seeds may be split over calls into one --out-dir: results.json merges
    them)."""
    methods: tuple[Literal["sft", "awr"], ...] = METHODS
    """Methods to run (each is deterministic per seed: the sft runs of two calls with the same
    data flags are the same runs, so a second call may run awr only, on the games the first
    call stored)."""
    threads: int = 1
    """torch CPU threads (the quickstart's default)."""
    out_dir: Path = Path("ludic_runs/awr_tictactoe")
    """Where data, runs and results.json go. Calls into one out-dir merge: results.json
    summarises every seed's runs there (earlier calls' included) and a seed's games are played
    once (a later call trains on the stored ones). Refused, before anything is written, when
    earlier results there came from other settings (any flag but --first-seed, --seeds,
    --methods and --out-dir), or a run of this call (its seed's start, sft or awr) would train
    where an earlier call left checkpoints: pass another one for a new run."""


def env_kwargs(cfg: AWRConfig) -> dict[str, Any]:
    """The quickstart's env: an illegal move costs -1 and the agent tries again."""
    return {
        "opponent": cfg.opponent,
        "epsilon": 0.5,
        "illegal_move": "retry",
        "observation": "compact",
    }


def requests(cfg: AWRConfig, n: int, sampling: SamplingConfig | None = None) -> list[Any]:
    env = ComponentSpec(name=ENV_NAME, kwargs=env_kwargs(cfg))
    protocol = ComponentSpec(name=PROTOCOL_NAME)
    if sampling is None:
        return [RolloutRequest(env=env, protocol=protocol) for _ in range(n)]
    return [RolloutRequest(env=env, protocol=protocol, sampling=sampling) for _ in range(n)]


async def expert_games(cfg: AWRConfig, tokenizer: Any, seed: int) -> list[Rollout]:
    """Every game of the scripted players (the first as the quickstart's, same seeds)."""
    seeds = SeedSequencer(run_seed=derive_seed(seed, "expert"))
    rollouts: list[Rollout] = []
    shares = expert_shares(cfg.expert_episodes, len(cfg.expert_epsilons))
    for index, (epsilon, share) in enumerate(zip(cfg.expert_epsilons, shares, strict=True)):
        policy = expert_policy(epsilon, taken=cfg.expert_taken)
        engine = rollout_engine(PolicyClient(policy, tokenizer), max_tokens=MAX_TOKENS)
        rollouts += await engine.run(seeds.seed_requests(requests(cfg, share), index))
    return rollouts


def expert_shares(games: int, players: int) -> list[int]:
    """Games per scripted player: `games` split as evenly as possible, the first players
    playing one more when it does not divide (every game is played)."""
    if players < 1:
        raise ValueError("--expert-epsilons needs at least one value (got none)")
    if games < players:
        raise ValueError(
            f"--expert-episodes {games} is fewer than the {players} --expert-epsilons values: "
            "give every player at least one game"
        )
    base, extra = divmod(games, players)
    return [base + (1 if i < extra else 0) for i in range(players)]


async def own_games(cfg: AWRConfig, model: Any, tokenizer: Any, seed: int) -> list[Rollout]:
    """`cfg.self_episodes` games of `model` at temperature 1."""
    sampling = SamplingConfig(temperature=1.0, max_tokens=MAX_TOKENS)
    seeds = SeedSequencer(run_seed=derive_seed(seed, "self"))
    config = EngineConfig(batch_invariant=True)
    with EmbeddedEngine(model, tokenizer, config=config) as served:
        engine = rollout_engine(served, max_tokens=MAX_TOKENS)
        return await engine.run(seeds.seed_requests(requests(cfg, cfg.self_episodes, sampling), 0))


def write_data(rollouts: Sequence[Rollout], out: Path) -> tuple[Path, Path]:
    """(all.jsonl, kept.jsonl): every game, and the won or drawn ones."""
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "all.jsonl", out / "kept.jsonl"
    write_rollouts_jsonl(rollouts, paths[0])
    write_rollouts_jsonl([r for r in rollouts if won_or_drew(r)], paths[1])
    return paths


def algorithm(cfg: AWRConfig, method: str) -> RLAlgorithm:
    """`make_sft()`, or `make_awr` with the AWR flags (a flag left at its default is not
    passed, so `make_awr` refuses only one that --baseline would ignore, naming the flag)."""
    if method == "sft":
        return make_sft()
    defaults = AWRConfig()
    options = {
        "state_prior": None if cfg.state_prior == defaults.state_prior else cfg.state_prior,
        "value_folds": None if cfg.value_folds == defaults.value_folds else cfg.value_folds,
        **board_featurizers(cfg.features, cfg.baseline),
    }
    try:  # make_awr only warns of an option --baseline ignores; a typed flag is refused
        check_baseline_options(cfg.baseline, {k: v for k, v in options.items() if v is not None})
        return make_awr(
            beta=cfg.beta,
            max_weight=cfg.max_weight,
            baseline=cfg.baseline,
            state_normalize=cfg.state_normalize,
            trained=trained_by(cfg.awr_games),  # the turns `train` keeps
            normalize_mean=cfg.normalize_mean,
            min_weight=cfg.min_weight,
            **options,
        )
    except UnreadAWROptionError as e:
        name = "features" if e.option.startswith("featurize") else e.option
        raise ValueError(
            f"--{name.replace('_', '-')} {getattr(cfg, name)} applies only to --baseline "
            f"{' or '.join(e.readers)}, not {e.baseline!r} (which would ignore it): drop it or "
            f"pass --baseline {e.readers[0]}"
        ) from e


def kept_games_only(data: Path) -> SampleFilter:
    """A sample filter keeping the turns of the won or drawn games of `data`."""
    kept = {r.id for r in read_rollouts_jsonl(data) if won_or_drew(r)}
    return lambda item: item.meta.get("rollout_id") in kept


def train(
    cfg: AWRConfig, method: str, data: Path, start: Path, steps: int, seed: int, out: Path
) -> Path:
    """`steps` of `method` from the model in `start` on `data`; returns the trained model dir.
    Both methods leave penalised turns out of the loss, as the quickstart's SFT."""
    model, tokenizer = load_model(start)
    algo = algorithm(cfg, method)
    source = training_source(cfg, algo, data, seed)
    trainer = make_trainer(model, tokenizer, algo, source, out=out, lr=cfg.lr, seed=seed)
    asyncio.run(trainer.train(steps, progress=False))
    return finish(trainer) / "model"


def training_source(cfg: AWRConfig, algo: RLAlgorithm, data: Path, seed: int) -> OfflineBatchSource:
    """The samples `algo` trains on: penalised turns left out (both methods), and for awr with
    --awr-games kept only the won or drawn games (weights computed on every game)."""
    filters: list[SampleFilter] = [drop_penalised_turns]
    if algo.name == "awr" and cfg.awr_games == "kept":
        filters.append(kept_games_only(data))
    return OfflineBatchSource(
        paths=data,
        credit_assigner=algo.credit_assigner,
        batch_size=cfg.batch_size,
        seed=seed,
        filters=filters,
    )


def evaluate(cfg: AWRConfig, model_dir: Path, stage: str) -> StageResult:
    model, tokenizer = load_model(model_dir)
    config = EngineConfig(batch_invariant=True)  # as the quickstart: independent of the load

    async def run() -> StageResult:
        with EmbeddedEngine(model, tokenizer, config=config) as engine:
            return await evaluate_stage(
                engine,
                stage,
                env_kwargs=env_kwargs(cfg),
                episodes=cfg.eval_episodes,
                temperature=cfg.eval_temperature,
                max_tokens=MAX_TOKENS,
            )

    return asyncio.run(run())


def weight_report(cfg: AWRConfig, rollouts: Sequence[Rollout]) -> dict[str, dict[str, float]]:
    """Per method, the mean training weight of the optimal, other legal and illegal moves
    (sft: 1 in a won or drawn game, else 0; awr: 0 outside the kept games with --awr-games
    kept; illegal moves are left out of both losses), and "ess": the effective sample size
    (sum w)^2 / (n sum w^2) of the legal moves' weights, n the number of legal moves."""
    awr = algorithm(cfg, "awr").credit_assigner
    assert isinstance(awr, AWRCredit)
    report = move_weights(awr, rollouts, awr_games=cfg.awr_games)
    if cfg.baseline not in ("group", "q_value"):
        report["awr"]["baseline_r2"] = baseline_r2(awr, rollouts)
    return report


def fresh_model(cfg: AWRConfig, seed: int, out: Path) -> tuple[Path, Any]:
    """The quickstart's untrained model for `seed` (task tokenizer), saved under `out`."""
    tokenizer = task_tokenizer(env_kwargs(cfg), seed=seed)
    spec = TinyModelSpec(
        hidden_size=cfg.hidden_size,
        intermediate_size=3 * cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
    )
    model, tokenizer = build_tiny_model(seed=seed, spec=spec, tokenizer=tokenizer)
    return save_model(model, tokenizer, out), tokenizer


def seed_dir(cfg: AWRConfig, seed: int) -> Path:
    """Where one seed's model, data and runs go."""
    return cfg.out_dir / f"seed_{seed}"


def trained_stages(cfg: AWRConfig) -> tuple[str, ...]:
    """The runs of each seed, each checkpointing under `seed_dir(cfg, seed) / stage`."""
    start = ("start",) if cfg.self_episodes > 0 else ()
    return (*start, *cfg.methods)


def check_out_dir(cfg: AWRConfig) -> None:
    """FileExistsError, before anything is written, when a run of this call would train where
    an earlier call left checkpoints: it would overwrite them. Other seeds' and methods' runs
    in --out-dir are left alone (see --first-seed and --methods)."""
    for seed in range(cfg.first_seed, cfg.first_seed + cfg.seeds):
        for stage in trained_stages(cfg):
            refuse_earlier_checkpoints(
                seed_dir(cfg, seed) / stage,
                fix=f"Pass another --out-dir for a new run (or delete {cfg.out_dir}).",
            )


def run_seed(cfg: AWRConfig, seed: int) -> dict[str, Any]:
    """Data, both runs and their evaluations for one seed; its `result.json` keeps the runs
    an earlier call left there (same settings: `check_settings`)."""
    out = seed_dir(cfg, seed)
    start, tokenizer = fresh_model(cfg, seed, out / "init")
    stored = out / "data" / "all.jsonl", out / "data" / "kept.jsonl"
    reuse = cfg.self_episodes == 0 and all(p.is_file() for p in stored)
    if reuse:  # an earlier call's games: its runs trained on these very ones
        rollouts = read_rollouts_jsonl(stored[0])
    else:
        rollouts = asyncio.run(expert_games(cfg, tokenizer, seed))
    record: dict[str, Any] = {}
    steps = cfg.steps
    if cfg.self_episodes > 0:
        _, kept = write_data(rollouts, out / "expert")
        start = train(cfg, "sft", kept, start, cfg.steps, seed, out / "start")
        record["start"] = evaluate(cfg, start, f"start (seed {seed})")
        model, tokenizer = load_model(start)
        rollouts += asyncio.run(own_games(cfg, model, tokenizer, seed))
        steps = cfg.continue_steps
    all_path, kept_path = stored if reuse else write_data(rollouts, out / "data")
    record["data"] = {
        "games": len(rollouts),
        "kept": sum(map(won_or_drew, rollouts)),
        "weights": weight_report(cfg, rollouts),
    }
    for method in cfg.methods:
        data = kept_path if method == "sft" else all_path
        trained = train(cfg, method, data, start, steps, seed, out / method)
        record[method] = evaluate(cfg, trained, f"{method} (seed {seed})")
    stages = {k: v.to_dict() for k, v in record.items() if isinstance(v, StageResult)}
    earlier = read_seed_record(out / "result.json")
    earlier_stages = {k: v.to_dict() for k, v in earlier.items() if isinstance(v, StageResult)}
    merged = {**earlier_stages, **stages, "data": record["data"], "config": config_of(cfg)}
    (out / "result.json").write_text(json.dumps(merged) + "\n")
    return record


RUN_SELECTION = ("first_seed", "seeds", "methods", "out_dir")
"""The flags that say which runs a call makes and where, not what a run is: calls into one
--out-dir may differ in these only."""


def config_of(cfg: AWRConfig) -> dict[str, Any]:
    """`cfg` as results files record it (JSON: tuples become lists, the path a string)."""
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    loaded: dict[str, Any] = json.loads(json.dumps(config))
    return loaded


def read_seed_record(path: Path) -> dict[str, Any]:
    """A seed's `result.json` with its evaluations as StageResults ({} when there is none)."""
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {k: StageResult(**v) if k in ("start", *METHODS) else v for k, v in raw.items()}


def seed_records(cfg: AWRConfig) -> dict[int, dict[str, Any]]:
    """Every seed's record in --out-dir (this call's and earlier calls'), by seed."""
    records = {}
    for path in cfg.out_dir.glob("seed_*/result.json"):
        suffix = path.parent.name.removeprefix("seed_")
        if suffix.isdigit():
            records[int(suffix)] = read_seed_record(path)
    return dict(sorted(records.items()))


def check_settings(cfg: AWRConfig) -> None:
    """ValueError, before anything is written, when --out-dir holds results (results.json or a
    seed's result.json) of other settings: results.json would summarise two experiments as
    one. Only the flags of `RUN_SELECTION` may differ between calls into one --out-dir."""
    wanted = {k: v for k, v in config_of(cfg).items() if k not in RUN_SELECTION}
    earlier = [cfg.out_dir / "results.json", *sorted(cfg.out_dir.glob("seed_*/result.json"))]
    for path in (p for p in earlier if p.is_file()):
        recorded = json.loads(path.read_text()).get("config")
        if not isinstance(recorded, dict):
            raise ValueError(
                f"{path} records no settings (an earlier version of this example wrote it), so "
                f"this call's results cannot be merged with it: pass another --out-dir"
            )
        differ = [k for k in wanted if recorded.get(k, wanted[k]) != wanted[k]]
        if differ:
            flags = "; ".join(
                f"--{k.replace('_', '-')} {recorded[k]} there, {wanted[k]} here" for k in differ
            )
            raise ValueError(
                f"{path} holds results of other settings ({flags}); calls into one --out-dir "
                "merge their results, so they may differ only in --first-seed, --seeds and "
                "--methods: pass another --out-dir for these settings"
            )


def interval(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and the half-width of its 95% t-interval (None for one value: no interval)."""
    mean, half = mean_ci95(values)
    return {"mean": mean, "ci95": None if math.isnan(half) else half, "n": len(values)}


def _plus_minus(half: float | None, scale: float = 1.0, digits: int = 3) -> str:
    """The " +- half" of a printed interval, or a note that one seed gives none."""
    return " (one seed: no interval)" if half is None else f" +- {half * scale:.{digits}f}"


RATES = {"win": "win", "illegal": "illegal moves"}
"""The summary's shares (printed in percent; a difference of them in percentage points)."""


def summary_line(name: str, stats: dict[str, dict[str, Any]]) -> str:
    """One printed summary row: rates in percent (points for the paired difference, whose
    name has a " - "), the mean reward as a signed number, and the number of seeds."""
    cells = []
    for key, v in stats.items():
        if key in RATES:
            mean = 100 * v["mean"]
            text = f"{mean:+.1f} points" if " - " in name else f"{mean:.1f}%"
            cells.append(f"{RATES[key]} {text}{_plus_minus(v['ci95'], 100, 1)}")
        else:
            cells.append(f"mean reward {v['mean']:+.3f}{_plus_minus(v['ci95'])}")
    n = next(iter(stats.values()))["n"]
    return f"{name}: {', '.join(cells)} ({n} seed{'s' if n != 1 else ''})"


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and 95% interval of win, illegal and reward per method over the records (seeds)
    that ran it, and of awr minus sft over those that ran both."""
    keys = ("win", "illegal", "mean_reward")
    summary: dict[str, Any] = {}
    for m in ("start", *METHODS):
        ran = [r[m] for r in records if m in r]
        if ran:
            summary[m] = {k: interval([getattr(s, k) for s in ran]) for k in keys}
    both = [r for r in records if all(m in r for m in METHODS)]
    if both:
        summary["awr - sft"] = {
            k: interval([getattr(r["awr"], k) - getattr(r["sft"], k) for r in both]) for k in keys
        }
    return summary


def check_baseline_flags(cfg: AWRConfig) -> None:
    """--state-prior, --value-folds or --features given with a --baseline that never reads it
    is refused (it would change nothing, silently): `make_awr` refuses it (see `algorithm`)."""
    algorithm(cfg, "awr")


def main(cfg: AWRConfig) -> dict[str, list[StageResult]]:
    """Each method's evaluations, one per seed: {"sft": [...], "awr": [...]} (and "start")."""
    expert_shares(cfg.expert_episodes, len(cfg.expert_epsilons))  # refuse bad splits early
    check_baseline_flags(cfg)
    check_settings(cfg)
    check_out_dir(cfg)
    torch.set_num_threads(cfg.threads)
    records = [run_seed(cfg, seed) for seed in range(cfg.first_seed, cfg.first_seed + cfg.seeds)]
    by_method = {m: [r[m] for r in records] for m in ("start", *METHODS) if m in records[0]}
    print_results(
        [s for stages in by_method.values() for s in stages],
        title="AWR vs rejection-sampled SFT",
    )
    every = seed_records(cfg)  # earlier calls' seeds in --out-dir too
    summary = summarise(list(every.values()))
    console = Console()
    console.print(f"Over the seeds in {cfg.out_dir} ({', '.join(map(str, every))}):")
    for name, stats in summary.items():
        console.print(summary_line(name, stats))
    runs = {
        m: [{**r[m].to_dict(), "seed": seed} for seed, r in every.items() if m in r]
        for m in ("start", *METHODS)
    }
    result = {
        "summary": summary,
        "runs": {m: stage_runs for m, stage_runs in runs.items() if stage_runs},
        "data": [{**r["data"], "seed": seed} for seed, r in every.items()],
        "seeds": list(every),
        "config": config_of(cfg),
    }
    (cfg.out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return by_method


if __name__ == "__main__":
    main(tyro.cli(AWRConfig))
