"""Where rollouts are generated, as one piece of wiring every program shares: the embedded engine
in this process, or one or more OpenAI-compatible servers (`ludic serve`, vLLM with Ludic's
extension) that a training run pushes its weights to after every step.

`InferenceArgs` is the argument block (embed it in a tyro config as a field typed
`InferenceFlags`: `--server-url A B C --server-token T --api-key K --served-model M`);
`make_inference` gives a client plus the matching weight
publisher (training), `make_client` a client only (evaluation, sampling; `close_client` closes
it); `check_engine_flags` refuses embedded-engine flags that cannot apply, `engine_settings`
names those on, `server_push_token` refuses a push that cannot be made before any server is
asked, `check_api_key` an API key with no server to send it to; each refusal names the
settings as its caller's user gave them (`as_flag` for a `ludic` command or `InferenceArgs`:
`--api-key`; `as_argument`, `make_inference`'s and `make_client`'s default: `api_key=`; both
from `ludic.recipes.served_model`). Several URLs give a
`ServerPool` client (calls spread over the servers, each episode kept on one) and one
`BroadcastPolicyPublisher` that pushes to all of them. Importing this module is light (no
torch); it starts no server.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import tyro

from ludic.recipes.served_model import (  # re-exported: importable from here as before
    ModelCard as ModelCard,
)
from ludic.recipes.served_model import (
    ModelsUnauthorized as ModelsUnauthorized,
)
from ludic.recipes.served_model import (
    Spell as Spell,
)
from ludic.recipes.served_model import (
    as_argument as as_argument,
)
from ludic.recipes.served_model import (
    as_flag as as_flag,
)
from ludic.recipes.served_model import (
    check_served_model as check_served_model,
)
from ludic.recipes.served_model import (
    model_cards as model_cards,
)
from ludic.recipes.served_model import (
    served_model_for as served_model_for,
)
from ludic.recipes.served_model import (
    served_model_name as served_model_name,
)
from ludic.recipes.served_model import (
    served_models as served_models,
)

if TYPE_CHECKING:
    from ludic.distributed import PolicyPublisher
    from ludic.inference.client import ChatClient

ServerUrls = str | Sequence[str] | None
"""One server URL, several, or None (the embedded engine)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceArgs:
    """Generate rollouts in process (the default), or on one or more inference servers."""

    server_url: tuple[str, ...] | None = None
    """Generate on these OpenAI-compatible servers (`ludic serve`, vLLM with Ludic's extension)
    instead of in process; several spread the episodes (each episode stays on one server, a
    dead server's episodes move to the others), and a training run pushes its weights to all
    of them after every step."""
    server_token: str | None = None
    """Bearer token of the servers' control endpoints (`ludic serve --token ...`), needed to
    push weights; default: the LUDIC_SERVER_TOKEN environment variable."""
    api_key: str | None = None
    """Bearer token of the servers' inference endpoints (/v1/*), if they need one (vLLM
    --api-key); the control token (--server-token) is not sent there, nor this one to the
    weight push."""
    served_model: str | None = None
    """Model name to send to the servers (default: the one model the first lists at
    /v1/models); a name a server's /v1/models does not list is refused before any episode."""
    server_ranks: int = 1
    """Weight-receiving ranks of each server: its tensor-parallel size for vLLM (1 for
    `ludic serve`)."""

    def make(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str = "cpu",
        batch_invariant: bool = False,
        prepacked_gemm: bool = False,
        wait_s: float | None = None,
    ) -> Inference:
        """`make_inference` with these arguments (a client and the weight publisher)."""
        return make_inference(
            model,
            tokenizer,
            server_url=self.server_url,
            server_token=self.server_token,
            api_key=self.api_key,
            served_model=self.served_model,
            device=device,
            batch_invariant=batch_invariant,
            prepacked_gemm=prepacked_gemm,
            server_ranks=self.server_ranks,
            wait_s=wait_s,
            spell=as_flag,  # these are flags (`InferenceFlags`)
        )

    def make_client(self, model: str | None = None, *, seed: int = 0) -> ChatClient:
        """`make_client` with these arguments (a client only)."""
        return make_client(
            self.server_url,
            model=model,
            served_model=self.served_model,
            api_key=self.api_key,
            seed=seed,
            spell=as_flag,
        )


InferenceFlags = Annotated[InferenceArgs, tyro.conf.arg(name="")]
"""`InferenceArgs` as a field of a tyro config whose flags keep their plain names
(`--server-url`, not `--inference.server-url`)."""


@dataclass(kw_only=True, slots=True)
class Inference:
    """Where rollouts are generated (`client`) and how new weights get there (`publisher`)."""

    client: ChatClient
    publisher: PolicyPublisher

    async def aclose(self) -> None:
        """Close the weight-sync group, if any (telling the servers: else they see the trainer
        vanish and log it as a lost connection), then the client (an HTTP connection pool, or
        the embedded engine's worker)."""
        close_publisher = getattr(self.publisher, "close", None)
        if close_publisher is not None:
            close_publisher()
        await close_client(self.client)


async def close_client(client: Any) -> None:
    """Close what `make_client` gave: HTTP connection pools (`aclose`), or the embedded
    engine's worker (`close`)."""
    aclose = getattr(client, "aclose", None)
    if aclose is not None:
        await aclose()
    close = getattr(client, "close", None)
    if close is not None:
        close()


def server_urls(server_url: ServerUrls, *, spell: Spell = as_flag) -> list[str]:
    """The URLs as a list (empty: none), checked: no duplicates, each http(s)://."""
    from ludic.inference.http.openai_client import check_server_url

    urls = [server_url] if isinstance(server_url, str) else list(server_url or ())
    for url in urls:
        check_server_url(url)
    if len(set(urls)) != len(urls):
        raise ValueError(f"{spell('--server-url')} names a server twice: {urls}")
    return urls


def make_inference(
    model: Any,
    tokenizer: Any,
    *,
    server_url: ServerUrls = None,
    server_token: str | None = None,
    api_key: str | None = None,
    served_model: str | None = None,
    device: str = "cpu",
    batch_invariant: bool = False,
    prepacked_gemm: bool = False,
    server_ranks: int = 1,
    wait_s: float | None = None,
    max_tokens: int | None = None,
    spell: Spell = as_argument,
) -> Inference:
    """The embedded engine on a copy of `model` (a LoRA model, before or after `add_lora`:
    its merged base model, as the Trainer publishes it) with an in-process publisher, or, with
    `server_url` (one URL or several), a client for those servers plus a
    `BroadcastPolicyPublisher` pushing weights to all of them in one broadcast (gloo from CPU,
    NCCL from a CUDA device). `api_key` is the servers' inference key (vLLM --api-key), sent
    on the client's requests and on `/v1/models`; the push sends `server_token` only.
    `served_model` None asks the first server which model it serves (`/v1/models`); either
    name is refused (`served_model_for`) where a server's `/v1/models` does not list it, before
    any push or episode. `wait_s` waits up to that many seconds for the servers to listen
    before asking them anything, as `ludic train` does (300: its `SERVER_WAIT_S`), for a
    program that has just started them (`ludic serve ... &`): while waiting it prints a line
    to stderr at once and every 30 s (a script without logging configured shows it too), it
    blocks the caller (its event loop too), and a host that does not resolve, or nothing
    listening once the wait is over, is a ValueError naming the server and `server_url=`
    (`wait_for_servers_blocking`). Default None: no wait, a server not listening yet is refused
    (async code can `await wait_for_servers(urls)` first). Every refusal names the settings as
    `spell` gives them: the arguments (`as_argument`, `served_model=`), or a command's flags
    (`as_flag`, `--served-model`: `ludic train`, `InferenceArgs`). Create it inside the
    event loop that will use it (the HTTP client is bound to it).
    `batch_invariant` builds the embedded engine with `EngineConfig(batch_invariant=True)`,
    `prepacked_gemm` with `EngineConfig(prepacked_gemm=True)` (faster CPU decode, float-noise
    rounding against the trainer; `check_prepacked_gemm`); `server_ranks` is each server's
    tensor-parallel size (vLLM; every rank receives the push)."""
    urls = server_urls(server_url, spell=spell)
    if wait_s is not None and not wait_s >= 0:  # nan too
        raise ValueError(f"wait_s must be >= 0 seconds (None: no wait), got {wait_s}")
    check_prepacked_gemm(
        prepacked_gemm,
        batch_invariant=batch_invariant,
        server_url=urls,
        device=device,
        spell=spell,
    )
    check_api_key(api_key, urls, spell=spell)
    if not urls:
        from ludic.distributed import InProcessPublisher
        from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
        from ludic.inference.embedded.engine_config import model_context
        from ludic.training.lora import merged_copy

        context = model_context(model)  # the engine's
        if max_tokens is not None and max_tokens >= context:  # else every episode fails (a step)
            flag = spell("--max-tokens").removesuffix("=")
            raise ValueError(
                f"{flag} {max_tokens} leaves no room for a prompt: the model's context is "
                f"{context} tokens (prompt and completion together), so every request would be "
                f"refused; pass {flag} below {context} (the prompt's tokens count too)"
            )
        config = EngineConfig(batch_invariant=batch_invariant, prepacked_gemm=prepacked_gemm)
        served: Any = merged_copy(model)  # LoRA: merged, under the names the Trainer publishes
        engine = EmbeddedEngine(served, tokenizer, config=config)
        return Inference(client=engine, publisher=InProcessPublisher(engine))
    server_token = server_push_token(server_token, batch_invariant=batch_invariant, spell=spell)
    if wait_s is not None:  # after what needs no server: a missing token is refused at once
        from ludic.inference.http.server_wait import wait_for_servers_blocking

        setting = spell("--server-url")
        wait_for_servers_blocking(urls, within_s=wait_s, say=_say, setting=setting)
    from ludic.distributed import BroadcastPolicyPublisher

    # asked as the client asks, with the API key (the control token is not one)
    # not one 404 (or, past the context, one 400) per episode
    name = served_model_for(urls, served_model, api_key, max_tokens=max_tokens, spell=spell)
    backend = push_backend_for(urls, server_token, device, spell=spell)
    publisher = BroadcastPolicyPublisher(
        urls, server_token, backend=backend, probe_model=model, server_ranks=server_ranks
    )
    client = make_client(urls, served_model=name, api_key=api_key, spell=spell)
    return Inference(client=client, publisher=publisher)


def _say(line: str) -> None:
    """A waiting line of `make_inference(..., wait_s=...)`, on stderr: shown without logging
    configured (an INFO log line is not), as the `ludic` commands print theirs."""
    print(line, file=sys.stderr, flush=True)


def check_api_key(api_key: str | None, server_url: ServerUrls, *, spell: Spell = as_flag) -> None:
    """Refuse --api-key without --server-url: it is the key of a server's inference endpoints,
    and the embedded engine (or `ludic train --local-server`'s child, which wants none) has
    none to send it to. Cheap; `ludic train` calls it among its flag checks. `spell`: how the
    refusal names the settings (`as_argument` from Python)."""
    if not api_key or server_urls(server_url, spell=spell):
        return
    key, url = spell("--api-key"), spell("--server-url")
    if spell is as_flag:  # the command's other way to a server, which wants no key
        raise ValueError(
            f"{key} is the key of {url}'s inference endpoints (vLLM --api-key), and this run "
            f"has no {url} (the embedded engine, or --local-server, wants none): drop {key}, "
            f"or pass {url}"
        )
    raise ValueError(
        f"{key} is the key of the servers' inference endpoints (vLLM --api-key), and there is "
        f"no {url} (the embedded engine wants none): drop {key}, or pass {url}"
    )


def server_push_token(
    server_token: str | None,
    *,
    flag: str = "--server-token",
    batch_invariant: bool = False,
    spell: Spell = as_flag,
) -> str:
    """The control token a training run pushes its weights to its servers with (`server_token`,
    else LUDIC_SERVER_TOKEN), refusing what makes a push impossible before any server is asked:
    no token, one no server can hold (`ludic serve` refuses to start with a token that is not
    printable ASCII or has surrounding spaces, and an HTTP header cannot carry one reliably), or
    `batch_invariant` (the embedded engine's flag: a server batches itself). `flag` is the
    command's token flag, named in the refusal (`ludic learner`: `--token`), as `spell` gives
    it (`as_argument` from Python: `server_token=`). A command that waits for its servers to
    listen calls it first, so a missing flag is not found only once they are up."""
    from ludic.inference.http.auth import TOKEN_ENV, well_formed_token

    token = server_token or os.environ.get(TOKEN_ENV)
    flag = spell(flag)
    if batch_invariant:
        drop = f"{spell('--batch-invariant')} or {spell('--server-url')}"
        trainer_side = "TrainerConfig(batch_invariant=True)"
        if spell is as_flag:  # the trainer's side is not a flag of `ludic train`
            trainer_side += " in Python, which `ludic train` does not set with --server-url"
        raise ValueError(
            "batch_invariant applies to the embedded engine; a server decides batching itself "
            "(start it with `ludic serve --batch-invariant`; vLLM: VLLM_BATCH_INVARIANT=1). "
            f"Drop {drop}; the trainer's side against such a server is {trainer_side}"
        )
    if not token:
        raise ValueError(
            f"a server URL needs its control token to push weights: pass {flag} with the token "
            f"the server was started with (`ludic serve --model DIR --token SECRET`), or set "
            f"{TOKEN_ENV}"
        )
    if not well_formed_token(token):  # the rule `ludic serve` applies to its own token
        given = flag if server_token else f"${TOKEN_ENV}"
        raise ValueError(
            f"the control token in {given} is not printable ASCII or has surrounding spaces "
            "(a newline or tab?), so no server holds it (`ludic serve --token` refuses such a "
            "token): pass the token the server was started with"
        )
    return token


def push_backend_for(
    urls: Sequence[str], token: str, device: str, *, spell: Spell = as_flag
) -> Literal["gloo", "nccl"]:
    """NCCL from a CUDA trainer, unless a server's weight-sync status says it serves on the CPU
    or on the trainer's own GPU (NCCL cannot join those): then gloo, and a warning saying why
    (naming the server setting as `spell` gives it). A server whose status cannot be read keeps
    NCCL (the push then reports what is wrong)."""
    if not device.startswith("cuda"):
        return "gloo"
    import httpx

    from ludic.distributed.push_backend import push_backend

    statuses: dict[str, dict[str, Any]] = {}
    for url in urls:
        status_url = url.rstrip("/").removesuffix("/v1") + "/ludic/weights/status"
        try:
            reply = httpx.get(status_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            reply.raise_for_status()
            statuses[url] = reply.json()
        except (httpx.HTTPError, ValueError):
            continue
    backend, why = push_backend(device, statuses, server_setting=spell("--server-url"))
    if why:
        warnings.warn(why, stacklevel=2)
    return backend


def check_prepacked_gemm(
    prepacked_gemm: bool,
    *,
    batch_invariant: bool,
    server_url: ServerUrls,
    device: str,
    model: str | None = None,
    spell: Spell = as_flag,
) -> None:
    """ValueError naming the flags when --prepacked-gemm cannot apply: with --batch-invariant
    (they round differently), with --server-url (a server packs its own weights: `ludic serve
    --prepacked-gemm`), off the CPU, or on `model`, a model directory the command loads in the
    dtype it was saved in, when that is not float32 (read from its config.json, as `ludic
    serve` does; None: the command loads float32 whatever was saved, as `ludic train` and
    `ludic actor` do). `spell`: how the refusal names the settings (`as_argument` from
    Python). Cheap; commands call it before any model loads."""
    if not prepacked_gemm:
        return
    packed = spell("--prepacked-gemm")
    if batch_invariant:
        invariant = spell("--batch-invariant")
        raise ValueError(
            f"{packed} and {invariant} round their GEMMs differently; pass one of them "
            f"({invariant}: reproducible logprobs; {packed}: faster decode)"
        )
    if server_urls(server_url, spell=spell):
        drop = "the flag" if spell is as_flag else packed
        raise ValueError(
            f"{packed} applies to the embedded engine, not to {spell('--server-url')}; start "
            f"the server with `ludic serve --prepacked-gemm` and drop {drop} here"
        )
    if not device.startswith("cpu"):
        raise ValueError(
            f"{packed} packs weights for the CPU's oneDNN GEMMs; {spell('--device')} is "
            f"{device!r}: drop {packed} or run on the CPU"
        )
    from ludic.inference.http.serve_config import saved_dtype  # `ludic serve`'s reading

    dtype = saved_dtype(model) if model is not None else None
    if dtype not in (None, "float32"):
        raise ValueError(
            f"{packed} needs float32 weights, and {spell('--model')} {model} is saved in "
            f"{dtype} (loaded as saved): drop {packed}, or save a float32 copy of the model"
        )


def check_engine_flags(
    *,
    batch_invariant: bool,
    prepacked_gemm: bool,
    server_url: ServerUrls,
    device: str = "cpu",
    model: str | None = None,
) -> None:
    """ValueError naming the flags when the embedded engine's options cannot apply:
    `check_prepacked_gemm`'s cases (`model`: the directory loaded in its saved dtype, as `ludic
    eval` loads it), and --batch-invariant with --server-url (a server decides its own
    batching). Cheap; commands call it before any model loads or service is reached."""
    check_prepacked_gemm(
        prepacked_gemm,
        batch_invariant=batch_invariant,
        server_url=server_url,
        device=device,
        model=model,
    )
    if batch_invariant and server_urls(server_url):
        raise ValueError(
            "--batch-invariant applies to the embedded engine, not to --server-url; start the "
            "server with `ludic serve --batch-invariant` and drop the flag here"
        )


def engine_settings(config: Any) -> str:
    """The embedded engine's flags `config` (an `EngineConfig`, or a command's config with the
    same two fields) turns on, as `ludic serve`, `ludic actor` and `ludic eval` name them ("default kernels"
    when none)."""
    flags = [
        flag
        for flag, on in (
            ("--batch-invariant", config.batch_invariant),
            ("--prepacked-gemm", config.prepacked_gemm),
        )
        if on
    ]
    return " ".join(flags) if flags else "default kernels"


def make_client(
    server_url: ServerUrls = None,
    *,
    model: str | None = None,
    served_model: str | None = None,
    api_key: str | None = None,
    seed: int = 0,
    spell: Spell = as_argument,
) -> ChatClient:
    """A client for the server(s) at `server_url` (several: a `ServerPool`), or, without one,
    the embedded engine over `model` (`load_policy`: a local directory, a hub id, or None for a
    fresh tiny model). `api_key`: bearer token of the servers' inference endpoints, if any.
    `served_model` None asks the first server which one model it serves (`/v1/models`).
    `spell`: how refusals name the settings (a command passes `as_flag`)."""
    urls = server_urls(server_url, spell=spell)
    if not urls:
        from ludic.inference.embedded.engine import EmbeddedEngine
        from ludic.recipes.training import load_policy

        policy, tokenizer = load_policy(model, seed=seed)
        return EmbeddedEngine(policy, tokenizer)
    from ludic.inference.http.openai_client import OpenAICompatibleClient
    from ludic.inference.http.pool import ServerPool

    name = served_model or served_model_name(urls[0], api_key, spell=spell)
    if len(urls) == 1:
        return OpenAICompatibleClient(urls[0], model=name, api_key=api_key)
    return ServerPool.from_urls(urls, name, api_key=api_key)
