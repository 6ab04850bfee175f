"""Where rollouts are generated, as one piece of wiring every program shares: the embedded engine
in this process, or one or more OpenAI-compatible servers (`ludic serve`, vLLM with Ludic's
extension) that a training run pushes its weights to after every step.

`InferenceArgs` is the argument block (embed it in a tyro config as a field typed
`InferenceFlags`: `--server-url A B C --server-token T --api-key K --served-model M`);
`make_inference` gives a client plus the matching weight
publisher (training), `make_client` a client only (evaluation, sampling; `close_client` closes
it); `check_engine_flags` refuses embedded-engine flags that cannot apply, `engine_settings`
names those on, `server_push_token` refuses a push that cannot be made before any server is
asked, `check_api_key` an API key with no server to send it to. Several URLs give a
`ServerPool` client (calls spread over the servers, each episode kept on one) and one
`BroadcastPolicyPublisher` that pushes to all of them. Importing this module is light (no
torch); it starts no server.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import tyro

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
        )

    def make_client(self, model: str | None = None, *, seed: int = 0) -> ChatClient:
        """`make_client` with these arguments (a client only)."""
        return make_client(
            self.server_url,
            model=model,
            served_model=self.served_model,
            api_key=self.api_key,
            seed=seed,
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


def server_urls(server_url: ServerUrls) -> list[str]:
    """The URLs as a list (empty: none), checked: no duplicates, each http(s)://."""
    from ludic.inference.http.openai_client import check_server_url

    urls = [server_url] if isinstance(server_url, str) else list(server_url or ())
    for url in urls:
        check_server_url(url)
    if len(set(urls)) != len(urls):
        raise ValueError(f"--server-url names a server twice: {urls}")
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
) -> Inference:
    """The embedded engine on a copy of `model` (a LoRA model, before or after `add_lora`:
    its merged base model, as the Trainer publishes it) with an in-process publisher, or, with
    `server_url` (one URL or several), a client for those servers plus a
    `BroadcastPolicyPublisher` pushing weights to all of them in one broadcast (gloo from CPU,
    NCCL from a CUDA device). `api_key` is the servers' inference key (vLLM --api-key), sent
    on the client's requests and on `/v1/models`; the push sends `server_token` only.
    `served_model` None asks the first server which model it serves (`/v1/models`); either name is refused (`served_model_for`) where a server's `/v1/models`
    does not list it, before any push or episode. It does not wait for the servers to listen:
    `ludic train` does first (`wait_for_servers`), so one still loading is not refused. Create
    it inside the event loop that will use it (the HTTP client is bound to it).
    `batch_invariant` builds the embedded engine with `EngineConfig(batch_invariant=True)`,
    `prepacked_gemm` with `EngineConfig(prepacked_gemm=True)` (faster CPU decode, float-noise
    rounding against the trainer; `check_prepacked_gemm`); `server_ranks` is each server's
    tensor-parallel size (vLLM; every rank receives the push)."""
    urls = server_urls(server_url)
    check_prepacked_gemm(
        prepacked_gemm, batch_invariant=batch_invariant, server_url=urls, device=device
    )
    check_api_key(api_key, urls)
    if not urls:
        from ludic.distributed import InProcessPublisher
        from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
        from ludic.training.lora import merged_copy

        config = EngineConfig(batch_invariant=batch_invariant, prepacked_gemm=prepacked_gemm)
        served: Any = merged_copy(model)  # LoRA: merged, under the names the Trainer publishes
        engine = EmbeddedEngine(served, tokenizer, config=config)
        return Inference(client=engine, publisher=InProcessPublisher(engine))
    server_token = server_push_token(server_token, batch_invariant=batch_invariant)
    from ludic.distributed import BroadcastPolicyPublisher

    # asked as the client asks, with the API key (the control token is not one)
    name = served_model_for(urls, served_model, api_key)  # not one 404 per episode
    backend = push_backend_for(urls, server_token, device)
    publisher = BroadcastPolicyPublisher(
        urls, server_token, backend=backend, probe_model=model, server_ranks=server_ranks
    )
    client = make_client(urls, served_model=name, api_key=api_key)
    return Inference(client=client, publisher=publisher)


def check_api_key(api_key: str | None, server_url: ServerUrls) -> None:
    """Refuse --api-key without --server-url: it is the key of a server's inference endpoints,
    and the embedded engine (or `ludic train --local-server`'s child, which wants none) has
    none to send it to. Cheap; `ludic train` calls it among its flag checks."""
    if api_key and not server_urls(server_url):
        raise ValueError(
            "--api-key is the key of --server-url's inference endpoints (vLLM --api-key), and "
            "this run has no --server-url (the embedded engine, or --local-server, wants "
            "none): drop --api-key, or pass --server-url"
        )


def server_push_token(
    server_token: str | None, *, flag: str = "--server-token", batch_invariant: bool = False
) -> str:
    """The control token a training run pushes its weights to its servers with (`server_token`,
    else LUDIC_SERVER_TOKEN), refusing what makes a push impossible before any server is asked:
    no token, one no server can hold (`ludic serve` refuses to start with a token that is not
    printable ASCII or has surrounding spaces, and an HTTP header cannot carry one reliably), or
    `batch_invariant` (the embedded engine's flag: a server batches itself). `flag` is the
    command's token flag, named in the refusal (`ludic learner`: `--token`). A command that
    waits for its servers to listen calls it first, so a missing flag is not found only once
    they are up."""
    from ludic.inference.http.auth import TOKEN_ENV, well_formed_token

    token = server_token or os.environ.get(TOKEN_ENV)
    if batch_invariant:
        raise ValueError(
            "batch_invariant applies to the embedded engine; a server decides batching itself "
            "(start it with `ludic serve --batch-invariant`; vLLM: VLLM_BATCH_INVARIANT=1). "
            "Drop --batch-invariant or --server-url; the trainer's side against such a server "
            "is TrainerConfig(batch_invariant=True) in Python, which `ludic train` does not set "
            "with --server-url"
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


def push_backend_for(urls: Sequence[str], token: str, device: str) -> Literal["gloo", "nccl"]:
    """NCCL from a CUDA trainer, unless a server's weight-sync status says it serves on the CPU
    or on the trainer's own GPU (NCCL cannot join those): then gloo, and a warning saying why.
    A server whose status cannot be read keeps NCCL (the push then reports what is wrong)."""
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
    backend, why = push_backend(device, statuses)
    if why:
        warnings.warn(why, stacklevel=2)
    return backend


def check_prepacked_gemm(
    prepacked_gemm: bool, *, batch_invariant: bool, server_url: ServerUrls, device: str
) -> None:
    """ValueError naming the flags when --prepacked-gemm cannot apply: with --batch-invariant
    (they round differently), with --server-url (a server packs its own weights: `ludic serve
    --prepacked-gemm`) or off the CPU. Cheap; commands call it before any model loads."""
    if not prepacked_gemm:
        return
    if batch_invariant:
        raise ValueError(
            "--prepacked-gemm and --batch-invariant round their GEMMs differently; pass one of "
            "them (--batch-invariant: reproducible logprobs; --prepacked-gemm: faster decode)"
        )
    if server_urls(server_url):
        raise ValueError(
            "--prepacked-gemm applies to the embedded engine, not to --server-url; start the "
            "server with `ludic serve --prepacked-gemm` and drop the flag here"
        )
    if not device.startswith("cpu"):
        raise ValueError(
            f"--prepacked-gemm packs weights for the CPU's oneDNN GEMMs; --device is {device!r}: "
            "drop --prepacked-gemm or run on the CPU"
        )


def check_engine_flags(
    *, batch_invariant: bool, prepacked_gemm: bool, server_url: ServerUrls, device: str = "cpu"
) -> None:
    """ValueError naming the flags when the embedded engine's options cannot apply:
    `check_prepacked_gemm`'s cases, and --batch-invariant with --server-url (a server decides
    its own batching). Cheap; commands call it before any model loads or service is reached."""
    check_prepacked_gemm(
        prepacked_gemm, batch_invariant=batch_invariant, server_url=server_url, device=device
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
) -> ChatClient:
    """A client for the server(s) at `server_url` (several: a `ServerPool`), or, without one,
    the embedded engine over `model` (`load_policy`: a local directory, a hub id, or None for a
    fresh tiny model). `api_key`: bearer token of the servers' inference endpoints, if any."""
    urls = server_urls(server_url)
    if not urls:
        from ludic.inference.embedded.engine import EmbeddedEngine
        from ludic.recipes.training import load_policy

        policy, tokenizer = load_policy(model, seed=seed)
        return EmbeddedEngine(policy, tokenizer)
    from ludic.inference.http.openai_client import OpenAICompatibleClient
    from ludic.inference.http.pool import ServerPool

    name = served_model or served_model_name(urls[0], api_key)
    if len(urls) == 1:
        return OpenAICompatibleClient(urls[0], model=name, api_key=api_key)
    return ServerPool.from_urls(urls, name, api_key=api_key)


_LOG = logging.getLogger(__name__)

ROUTES_BY_NAME = frozenset({"ludic", "vllm"})
"""The `/v1/models` cards' `owned_by` of servers that answer a model name they do not list with
a 404 (`ludic serve`, vLLM). Others may not: SGLang's OpenAI routes ignore the request's model."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCard:
    """One model a server lists at `/v1/models`: its name and who serves it (`owned_by`)."""

    id: str
    owned_by: str | None


class ModelsUnauthorized(ValueError):
    """A server's `/v1/models` answered 401 or 403: it wants an API key not sent (or not this
    one); its inference requests would be refused the same way."""


def served_model_name(
    server_url: str, api_key: str | None = None, *, key_flag: str = "--api-key"
) -> str:
    """The one model an OpenAI-compatible server serves, from its `/v1/models` (`key_flag`:
    see `model_cards`)."""
    names = served_models(server_url, api_key, key_flag=key_flag)
    if not names:
        raise ValueError(
            f"{_models_url(server_url)} lists no model, so there is no model name to send: "
            "pass --served-model with the name the server serves (or wait until it has loaded one)"
        )
    if len(names) != 1:
        raise ValueError(
            f"{_models_url(server_url)} serves {', '.join(names)}; choose one with --served-model"
        )
    return names[0]


def served_model_for(
    urls: Sequence[str],
    served_model: str | None,
    api_key: str | None,
    *,
    key_flag: str = "--api-key",
) -> str:
    """The model name to send to every server in `urls`: `served_model` (--served-model), else
    the one model the first server lists at `/v1/models`; refused (`check_served_model`) where
    another server's `/v1/models` does not list it, since a `ServerPool` asks each of them for
    that one name and every request to such a server fails with a 404. `api_key` is what the
    client sends on inference requests (`key_flag`: see `model_cards`)."""
    if served_model:
        check_served_model(urls, served_model, api_key, key_flag=key_flag)
        return served_model
    name = served_model_name(urls[0], api_key, key_flag=key_flag)
    check_served_model(urls[1:], name, api_key, listed_by=urls[0], key_flag=key_flag)
    return name


def check_served_model(
    server_url: ServerUrls,
    name: str,
    api_key: str | None = None,
    *,
    listed_by: str | None = None,
    key_flag: str = "--api-key",
) -> None:
    """Refuse a model name that a server's `/v1/models` does not list (else every request to it
    fails with a 404), naming the models it lists; several URLs: each one, as a `ServerPool`
    asks them all for `name`. `listed_by`: the server whose one model `name` is (no
    --served-model was given), checked against the others. Refused only where the server is
    known to route by model name (`ROUTES_BY_NAME`: `ludic serve`, vLLM); another (SGLang
    answers any name) gets one warning line and goes on. A server that wants an API key not
    given is refused (`ModelsUnauthorized`, naming `key_flag`); one without `/v1/models`, one
    that lists nothing, or one that does not answer passes, and its first request says what is
    wrong."""
    urls = server_urls(server_url)  # a malformed URL is still refused
    for url in urls:
        try:
            cards = model_cards(url, api_key, key_flag=key_flag)
        except ModelsUnauthorized:
            raise
        except ValueError:
            continue
        names = [card.id for card in cards]
        if not names or name in names:
            continue
        head = (
            f"--served-model {name}"
            if listed_by is None
            else f"the model {name} (no --served-model: the one {_models_url(listed_by)} lists)"
        )
        if len(urls) > 1 or listed_by is not None:  # a ServerPool asks every server for one name
            fix = (
                "every --server-url gets the same model name: start them all serving one "
                "model, or pass --served-model with a name each of them lists"
            )
        elif len(names) == 1:
            fix = f"pass --served-model {names[0]} or leave the flag out"
        else:
            fix = "pass --served-model with one of them"
        problem = f"{head}: the server at {_models_url(url)} serves {', '.join(names)}, not {name}"
        owners = sorted({str(card.owned_by) for card in cards})
        if set(owners) <= ROUTES_BY_NAME:
            raise ValueError(f"{problem}; {fix}")
        _LOG.warning(
            "warning: %s; going on, as its models are owned_by %s, not ludic serve's or vLLM's, "
            "and such a server (SGLang) may answer any model name; if its requests fail with a "
            "404, %s",
            problem,
            ", ".join(owners),
            fix,
        )


def served_models(
    server_url: str, api_key: str | None = None, *, key_flag: str = "--api-key"
) -> list[str]:
    """The model names an OpenAI-compatible server lists at `/v1/models` (`model_cards`)."""
    return [card.id for card in model_cards(server_url, api_key, key_flag=key_flag)]


def model_cards(
    server_url: str, api_key: str | None = None, *, key_flag: str = "--api-key"
) -> list[ModelCard]:
    """The models an OpenAI-compatible server lists at `/v1/models`, asked with `api_key` (what
    the client sends on inference requests); ValueError saying why when it cannot be asked
    (down, no such route, an answer that is no model list), `ModelsUnauthorized` for a 401 or
    403 naming `key_flag`, the command's API-key flag."""
    import httpx

    url = _models_url(server_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=30)
        if response.status_code in (401, 403):
            raise ModelsUnauthorized(_unauthorized(url, response, api_key, key_flag))
        response.raise_for_status()
        return [
            ModelCard(id=str(card["id"]), owned_by=card.get("owned_by"))
            for card in response.json()["data"]
        ]
    except ModelsUnauthorized:
        raise
    except (httpx.HTTPError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(
            f"could not ask {url} which model it serves ({type(e).__name__}: {e}); is the "
            "server up (`ludic serve --model DIR --port PORT`, or vLLM)? Or name the model "
            "(--served-model)"
        ) from e


def _unauthorized(url: str, response: Any, api_key: str | None, key_flag: str) -> str:
    refused = (
        f"the server at {url} answers {response.status_code} {response.reason_phrase}: it wants "
        f"an API key on its OpenAI routes (vLLM --api-key)"
    )
    if api_key is None:  # nor would the command's inference requests: every episode would fail
        return (
            f"{refused} and got none: pass the server's key with {key_flag} (without it this "
            "command sends none on its inference requests; a control token is not one)"
        )
    return f"{refused} and refused the one {key_flag} gives: pass the server's key"


def _models_url(server_url: str) -> str:
    from ludic.inference.http.openai_client import check_server_url

    check_server_url(server_url)  # `localhost:8000` is no server that is down
    return server_url.rstrip("/").removesuffix("/v1") + "/v1/models"
