"""`ludic eval`: evaluate a built-in or user env with a local model or a server, print a table.

The CLI module calls `run_eval_command(EvalConfig(...))`; everything heavy (torch, the model,
HTTP) is imported only when the command runs. One agent per seat-one env (SingleAgentProtocol);
multi-agent evaluation goes through the Python API (`run_eval` with your own registries).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from rich.console import Console

from ludic.agents.base import Agent
from ludic.context.full_dialog import FullDialog
from ludic.context.latest_observation import LatestObservationContext
from ludic.eval.core import EvalResult, make_eval_requests, run_eval
from ludic.eval.credit_report import CREDIT_FILE
from ludic.eval.env_spec import EnvFactory, resolve_env_factory, resolve_parser
from ludic.eval.evaluated_model import (
    RUN_FILE,
    describe_run,
    model_record,
    refuse_unfinished_checkpoint,
    write_run_record,
)
from ludic.eval.summary import print_summary
from ludic.inference.client import ChatClient
from ludic.inference.sampling import SamplingConfig
from ludic.interaction.single_agent import SingleAgentProtocol
from ludic.parsers import Parser
from ludic.recipes.algorithms import GiGPOOptions
from ludic.recipes.configs import (
    ContextChoice,
    ContextKind,
    context_line,
    context_of,
    one_seat_env,
    parse_env_kwargs,
    sampling_from_flags,
)
from ludic.recipes.count_checks import check_episode_timeout
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.rollouts.overflow import ended_by_context_overflow


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    """Evaluate a policy on an environment and print a summary table."""

    env: str
    """Built-in env name (from `ludic.envs.BUILTIN_ENVS`) or a `module:factory` import string
    whose factory returns a LudicEnv; the current directory is importable."""
    env_kwargs: str = "{}"
    """JSON object of keyword arguments for the env factory."""
    model: str | None = None
    """Local model directory for the embedded engine (default: a locally built tiny model); a
    training checkpoint's `.../step_N` (or its model/) is refused when it has no MANIFEST.json
    (its save was interrupted), naming the last complete step."""
    verify: Literal["sha256", "size"] = "sha256"
    """What a training checkpoint's model files are checked for against its MANIFEST.json before
    loading: sha256, sizes and contents (one pass over the weights: about a minute for a 28 GB
    checkpoint), or size, sizes only (no pass: a file changed at the same size, a flipped bit,
    loads and its wrong weights are evaluated unnoticed). A missing or truncated file is refused
    under both. Not with --server-url (serve with `ludic serve --verify size` instead)."""
    server_url: str | None = None
    """Base URL of an OpenAI-compatible server (vLLM, SGLang, `ludic serve`); overrides --model.
    One that does not listen yet (started just before, loading its model) is waited for, up to
    5 minutes, as `ludic actor` waits."""
    served_model: str | None = None
    """Model name to send to the server (default: the one model its `/v1/models` lists); a
    name that list does not hold is refused before any episode runs."""
    api_key: str | None = None
    """Bearer token for the server, if it needs one."""
    parser: str = "auto"
    """Action parser: auto (the `parser` attribute of the env factory or env class, e.g.
    `parser = xml_tag_parser("move")` in the class body; identity when there is none),
    identity, boxed, xml:TAG, or a `module:function` import string."""
    system_prompt: str | None = None
    """System prompt for the agent (default: the env's suggestion)."""
    num_problems: int = 16
    """Number of distinct problems (env seeds seed, seed+1, ...)."""
    samples_per_problem: int = 1
    """Episodes per problem; pass@k and mean@k are reported for k = 1 and k = this."""
    max_steps: int = 10
    """Env steps per episode before the protocol truncates it."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus (top-p) sampling, in (0, 1] (1: off); evaluate a run trained with
    `ludic train --top-p P` under the same transform by passing the same P."""
    max_tokens: int = 128
    """Completion token limit per model call."""
    context: ContextKind = "auto"
    """Agent memory: full (the whole dialog), latest (the system prompt, the latest
    observation and, after a reply that did not parse, that reply and its feedback), or auto:
    what the env declares (`suggested_context = "latest"` on its class, as tictactoe does),
    else full; as `ludic train --context` resolves it, so eval sees what training saw."""
    reject_incomplete: bool = False
    """Make a reply cut off at --max-tokens a parse failure that the parser never sees (as the
    quickstart does); off: the parser reads it like any other reply."""
    batch_invariant: bool = False
    """Run the embedded engine batch-invariant: an episode's tokens do not depend on the
    episodes beside it, so a seeded evaluation repeats exactly on the same machine, build and
    --threads (the quickstart's engine). Not with --server-url (serve with `ludic serve
    --batch-invariant` instead)."""
    prepacked_gemm: bool = False
    """Run the embedded engine's GEMMs on packed weight copies: faster decode on CPU, logprobs
    that differ from the default engine's by float noise (~1e-5..1e-4). Float32 on CPU; not
    with --batch-invariant or --server-url (serve with `ludic serve --prepacked-gemm`)."""
    threads: int | None = None
    """torch CPU threads of the embedded engine (None: torch's choice). The quickstart
    evaluates on 1; a batch-invariant result holds for a given thread count. Not with
    --server-url (serve with `ludic serve --threads N` instead)."""
    seed: int = 0
    """First env seed; sampling seeds are derived from it."""
    concurrency: int = 16
    """Episodes in flight at once."""
    episode_timeout_s: float | None = 600.0
    """Wall-clock limit per episode (None: no limit)."""
    out_dir: Path = Path("ludic_runs/eval")
    """Where episodes.jsonl, steps.jsonl, rollouts.jsonl, metrics.json and run.json (what was
    evaluated: the model's path, checkpoint step, policy version and MANIFEST.json digest, and
    the sampling) are written. One that holds an earlier run's records is refused (as `ludic train` refuses one holding an earlier
    run's checkpoints) unless --overwrite."""
    overwrite: bool = False
    """Replace the records an earlier run left in --out-dir (they are deleted before this
    evaluation starts, and the output says so)."""
    progress: bool = True
    """Show a progress bar over episodes."""
    credit: Literal["none", "gigpo"] = "none"
    """gigpo: also run GiGPO's credit (with --gigpo.*) over each problem's episodes and report
    the share of turns with an anchor state shared by another turn and the mean |A_E| and
    |A_S| (per turn in credit.jsonl): whether step-level credit has a signal on this env.
    Needs --samples-per-problem >= 2."""
    gigpo: GiGPOOptions = field(default_factory=GiGPOOptions)
    """GiGPO's knobs, as `ludic train --algorithm gigpo` takes them (only with --credit gigpo)."""


def run_eval_command(cfg: EvalConfig, *, console: Console | None = None) -> EvalResult:
    """Build the env, client and engine from `cfg`, evaluate, print and write the results."""
    console = console or Console()
    _check_engine_options(cfg)
    _check_counts(cfg)
    _check_credit_options(cfg)  # flag checks: before the out-dir, the model and any output
    sampling = eval_sampling(cfg)  # a bad --temperature / --top-p fails before the model loads
    env_factory = resolve_env_factory(cfg.env)  # a flag typo is named before the out-dir
    env_kwargs = parse_env_kwargs(cfg.env_kwargs)
    earlier = earlier_records(cfg.out_dir)
    if earlier and not cfg.overwrite:
        raise FileExistsError(
            f"{cfg.out_dir} holds an earlier run's records ({', '.join(p.name for p in earlier)})"
            "; this evaluation would replace them. Pass another --out-dir for a new one, or "
            "--overwrite to replace them."
        )
    if cfg.model is not None and not cfg.server_url:  # a bad --model: its error, and no more
        check_model(cfg.model)
        refuse_unfinished_checkpoint(cfg.model, verify=cfg.verify)
    # One env built up front (its kwargs checked, that it is one, with one seat), which also
    # reads the context it suggests: --context auto needs it.
    auto = cfg.context == "auto"
    suggested = one_seat_env(env_factory, env_kwargs, cfg.env, command="eval", auto=auto)
    parser = resolve_parser(cfg.parser, env_factory, env_kwargs)
    context = context_of(cfg, suggested)
    console.print(context_line(cfg, suggested))
    note = greedy_repeats_note(cfg)
    if note is not None:
        console.print(note, style="yellow", markup=False, highlight=False)
    model_dir = None if cfg.server_url else resolve_model_dir(cfg.model, console=console)
    if model_dir is not None:
        from ludic.recipes.inference import engine_settings

        console.print(f"engine: embedded on {model_dir} ({engine_settings(cfg)})")  # as actor
    if model_dir is not None and cfg.threads is not None:
        import torch

        torch.set_num_threads(cfg.threads)
    requests = make_eval_requests(
        env=ComponentSpec(name=cfg.env, kwargs=env_kwargs),
        protocol=ComponentSpec(name="single"),
        num_problems=cfg.num_problems,
        samples_per_problem=cfg.samples_per_problem,
        seed=cfg.seed,
        sampling=sampling,
        meta={"env": cfg.env},
    )
    served_model = None
    if cfg.server_url:  # after the checks that need no server, before --overwrite deletes
        served_model = reach_server(cfg.server_url, cfg, console)
    if earlier:
        for path in earlier:
            path.unlink()
        names = ", ".join(p.name for p in earlier)
        console.print(f"--overwrite: deleted the earlier run's records in {cfg.out_dir} ({names})")
    result = asyncio.run(
        _evaluate(cfg, env_factory, parser, context, model_dir, requests, served_model)
    )
    record = run_record(cfg, model_dir, served_model, env_kwargs, context)
    write_run_record(cfg.out_dir, record)
    if cfg.credit == "gigpo":
        _report_gigpo(cfg, result, console)
    print_summary(result.metrics, title=f"ludic eval: {cfg.env}", console=console)
    console.print(f"evaluated: {describe_run(record)}", markup=False, highlight=False)
    view = f"ludic view {cfg.out_dir / 'rollouts.jsonl'}"
    if model_dir is not None:
        view += f" --tokenizer {model_dir}"
    console.print(f"records in [bold]{cfg.out_dir}[/bold]; browse the episodes with: {view}")
    line = failure_line(result, context=context)
    if line is not None:
        console.print(line, style="bold red", markup=False, highlight=False)
    if result.rollouts and all(r.failed for r in result.rollouts):
        raise SystemExit(1)  # nothing was evaluated: a script must not read this as a result
    return result


EVAL_RECORDS = (
    *("episodes.jsonl", "steps.jsonl", "rollouts.jsonl", "metrics.json", CREDIT_FILE),
    *(RUN_FILE, "rollouts.html"),
)
"""What `ludic eval` writes in --out-dir (`EvalResult.write`, run.json, and credit.jsonl with
--credit), and `ludic view`'s page of rollouts.jsonl beside them, which would show the earlier
episodes."""


def run_record(
    cfg: EvalConfig,
    model_dir: str | None,
    served_model: str | None,
    env_kwargs: dict[str, object],
    context: str,
) -> dict[str, object]:
    """run.json: what was evaluated (the model, or the server and the name sent to it) and
    how (env, sampling, seeds, counts), so a results folder says which checkpoint it scored."""
    model: dict[str, object] = (
        {"server_url": cfg.server_url, "served_model": served_model}
        if model_dir is None
        else model_record(model_dir)
    )
    return {
        "model": model,
        "env": cfg.env,
        "env_kwargs": env_kwargs,
        "sampling": {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens,
        },
        "seed": cfg.seed,
        "num_problems": cfg.num_problems,
        "samples_per_problem": cfg.samples_per_problem,
        "max_steps": cfg.max_steps,
        "context": context,
    }


def earlier_records(out_dir: Path) -> list[Path]:
    """The files in `out_dir` that an earlier `ludic eval` (or a training run's rollouts.jsonl)
    left there and this evaluation would replace."""
    return [out_dir / name for name in EVAL_RECORDS if (out_dir / name).exists()]


def failure_line(result: EvalResult, *, context: str = "full") -> str | None:
    """The closing line for failed episodes (None when none failed): how many, and the first
    one's error, phase and type (each rollout's `meta["error"]` holds its own). A prompt past
    the model's context gets the flags that shorten it (`context`: what --context resolved
    to). When every episode failed, the table above measures nothing and `ludic eval` exits 1."""
    failed = [r for r in result.rollouts if r.failed]
    if not failed:
        return None
    first = failed[0].meta
    cause = (
        f"the first error ({first.get('error_phase', '?')}, {first.get('error_type', '?')}): "
        f"{first.get('error', '?')}"
    )
    if ended_by_context_overflow(failed[0]):  # the engine's own advice names its API
        shorter = "--context latest (the system prompt and the latest observation only), "
        cause += (
            ". The dialog outgrew the model's context: pass "
            f"{shorter if context == 'full' else ''}a smaller --max-tokens or fewer --max-steps"
            + ("" if context == "full" else ", or shorten the env's observation or system prompt")
        )
    elif first.get("error_phase") == "timeout":  # episodes in flight share one model
        cause += (
            ". --episode-timeout-s counts each episode from its start while --concurrency "
            "episodes share the model, so on a slow or loaded machine each lasts about as long "
            "as all of them: pass a larger --episode-timeout-s (or None) or a smaller "
            "--concurrency"
        )
    total = len(result.rollouts)
    if len(failed) == total:
        return (
            f"ludic eval: every one of the {total} episodes failed, so nothing was evaluated; "
            f"{cause}. Fix the cause and run again"
        )
    return f"ludic eval: {len(failed)} of {total} episodes failed (counted as unsolved); {cause}"


def eval_sampling(cfg: EvalConfig) -> SamplingConfig:
    """The episodes' sampling (--temperature, --top-p, --max-tokens); a value out of range
    raises ValueError naming the flags, as `ludic train` does."""
    return sampling_from_flags(cfg.temperature, cfg.top_p, cfg.max_tokens)


def reach_server(server_url: str, cfg: EvalConfig, console: Console) -> str:
    """Wait for --server-url to listen, as `ludic actor` does (one started just before loads its
    model first: up to 5 minutes, saying so every 30 s), then the model name to send: a
    --served-model its `/v1/models` lists, else the one model it lists (`served_model_for`),
    refused before any episode and before --overwrite deletes anything."""
    from ludic.inference.http.server_wait import wait_for_servers
    from ludic.recipes.inference import served_model_for, server_urls

    say = partial(console.print, markup=False, highlight=False)
    asyncio.run(wait_for_servers(server_urls(server_url), say=say))  # `localhost:8000`: refused
    return served_model_for([server_url], cfg.served_model, cfg.api_key, max_tokens=cfg.max_tokens)


def _check_engine_options(cfg: EvalConfig) -> None:
    from ludic.recipes.inference import check_engine_flags

    check_engine_flags(  # the refusals ludic train and ludic actor give, in the same words
        batch_invariant=cfg.batch_invariant,
        prepacked_gemm=cfg.prepacked_gemm,
        server_url=cfg.server_url,
        model=cfg.model,  # loaded in its saved dtype (None: the float32 tiny model)
    )
    if cfg.threads is not None and cfg.server_url:
        raise ValueError(
            "--threads sets the embedded engine's torch threads, not --server-url's; start "
            "the server with `ludic serve --threads N` and drop the flag here"
        )
    if cfg.verify != "sha256" and cfg.server_url:
        raise ValueError(
            "--verify sets what the embedded engine checks of --model's files, not "
            "--server-url's; start the server with `ludic serve --verify size` and drop the flag "
            "here"
        )
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"--threads must be >= 1 (or left out), got {cfg.threads}")


def greedy_repeats_note(cfg: EvalConfig) -> str | None:
    """What --temperature 0 does to several samples per problem: greedy decoding repeats one
    reply, so pass@k measured nothing pass@1 did not (the run still goes ahead)."""
    k = cfg.samples_per_problem
    if cfg.temperature != 0 or k < 2:
        return None
    return (
        f"note: --temperature 0 decodes greedily, so the {k} samples of each problem repeat one "
        f"another (on an env that starts the same for the same seed): pass@{k} and mean@{k} "
        "then equal pass@1 and mean@1. To measure pass@k, sample at a temperature above 0 "
        "(e.g. 1.0); for a greedy score, --samples-per-problem 1 is enough"
    )


def _check_counts(cfg: EvalConfig) -> None:
    """Refuse a count below 1 (or a timeout <= 0) naming its flag, before anything loads: they
    were refused by the components, after the model's lines (--concurrency after its load)."""
    counts = {
        "--num-problems": cfg.num_problems,
        "--samples-per-problem": cfg.samples_per_problem,
        "--max-steps": cfg.max_steps,
        "--concurrency": cfg.concurrency,
    }
    for flag, value in counts.items():
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    check_episode_timeout(cfg.episode_timeout_s)


def _check_credit_options(cfg: EvalConfig) -> None:
    if cfg.credit != "gigpo" and cfg.gigpo != GiGPOOptions():
        raise ValueError("--gigpo.* options apply only with --credit gigpo: add it or drop them")
    if cfg.credit == "gigpo" and cfg.samples_per_problem < 2:
        raise ValueError(
            "--credit gigpo compares the episodes of each problem: pass --samples-per-problem 2 "
            "or more"
        )


def _report_gigpo(cfg: EvalConfig, result: EvalResult, console: Console) -> None:
    """Add GiGPO's credit metrics to `result.metrics` (and metrics.json); write credit.jsonl."""
    from ludic.eval.credit_report import gigpo_credit_report, write_credit_rows

    metrics, rows = gigpo_credit_report(result.rollouts, cfg.gigpo)
    result.metrics.update(metrics)
    (cfg.out_dir / "metrics.json").write_text(
        json.dumps(result.metrics, indent=2) + "\n", encoding="utf-8"
    )
    path = write_credit_rows(rows, cfg.out_dir / CREDIT_FILE)
    console.print(f"GiGPO credit per turn: {path}")


async def _evaluate(
    cfg: EvalConfig,
    env_factory: EnvFactory,
    parser: Parser,
    context: ContextChoice,
    model_dir: str | None,
    requests: list[RolloutRequest],
    served_model: str | None = None,
) -> EvalResult:
    # The client is built, used and closed inside this one event loop (HTTP clients need that).
    client = build_client(cfg, model_dir, served_model)
    try:

        def protocol_factory() -> SingleAgentProtocol:
            agent = Agent(
                client,
                context=LatestObservationContext() if context == "latest" else FullDialog(),
                parser=parser,
                system_prompt=cfg.system_prompt,
                reject_incomplete_completions=cfg.reject_incomplete,
            )
            return SingleAgentProtocol(agent, max_steps=cfg.max_steps)

        engine = RolloutEngine(
            env_registry={cfg.env: env_factory},  # records name the env as --env does
            protocol_registry={"single": protocol_factory},
            concurrency=cfg.concurrency,
            episode_timeout_s=cfg.episode_timeout_s,
        )
        return await run_eval(engine, requests, progress=cfg.progress, out_dir=cfg.out_dir)
    finally:
        await _close(client)


async def _close(client: object) -> None:
    aclose = getattr(client, "aclose", None)
    if callable(aclose):
        await aclose()
        return
    close = getattr(client, "close", None)
    if callable(close):
        close()


def resolve_model_dir(model: str | None, *, console: Console) -> str:
    """`model` when it is a directory; None builds (or reuses) the cached tiny model."""
    if model is None:
        from ludic.models import tiny_model_dir

        model = str(tiny_model_dir())
        console.print(f"no --model given: using the tiny local model at {model}")
    check_model(model)
    return model


def check_model(model: str) -> None:
    """Refuse a `--model` that holds no saved model (a missing path, a run folder, a folder
    without config.json), naming the path to pass instead, without loading anything."""
    from ludic.models.loading import check_model_directory

    try:
        check_model_directory(model)
    except FileNotFoundError as e:
        raise ValueError(f"--model {model}: {e}") from None


def build_client(
    cfg: EvalConfig, model_dir: str | None, served_model: str | None = None
) -> ChatClient:
    """An OpenAI-compatible client for `cfg.server_url` asking for `served_model` (the name
    `reach_server` resolved; default: --served-model, else the one model the server lists), else
    the embedded engine over `model_dir`."""
    if cfg.server_url:
        from ludic.inference.http.openai_client import OpenAICompatibleClient
        from ludic.recipes.inference import served_model_name

        name = served_model or cfg.served_model or served_model_name(cfg.server_url, cfg.api_key)
        return OpenAICompatibleClient(base_url=cfg.server_url, model=name, api_key=cfg.api_key)
    if model_dir is None:
        raise ValueError("the embedded engine needs a model directory (or pass --server-url)")
    from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig

    config = EngineConfig(batch_invariant=cfg.batch_invariant, prepacked_gemm=cfg.prepacked_gemm)
    return EmbeddedEngine.from_pretrained(model_dir, config=config, verify=cfg.verify)
