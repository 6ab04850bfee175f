"""Tiny Llama-style causal LMs (about 3M parameters) built locally, cached on disk by content.

For tests, demos and benchmarks that must run on one CPU with no network. The weights are random
(seeded); nothing here trains them or fetches anything from a model hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ludic.models.corpus import tiny_corpus
from ludic.models.loading import load_model, save_model
from ludic.models.tokenizer import CHATML_TEMPLATE, ENDOFTEXT, IM_END, train_tiny_tokenizer


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyModelSpec:
    """Shape of a tiny model. The defaults give about 3M parameters.

    `initializer_range` is larger than Llama's 0.02 so the random model has peaked next-token
    distributions (greedy decoding is then stable under float noise from batching).
    """

    hidden_size: int = 256
    intermediate_size: int = 704
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    initializer_range: float = 0.1
    tokenizer_vocab_size: int = 2048

    def __post_init__(self) -> None:
        """Refuse sizes that build a model whose first forward fails (or that cannot be built),
        naming the fields: transformers accepts key/value heads that do not divide the heads
        and an odd head size, and fails inside attention on the first forward."""
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"TinyModelSpec: {f.name} must be > 0, got {value}")
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if self.hidden_size % heads or (self.hidden_size // heads) % 2:
            raise ValueError(
                f"TinyModelSpec: hidden_size {self.hidden_size} must be num_attention_heads "
                f"{heads} times an even head size (rotary embeddings rotate pairs), e.g. "
                f"hidden_size {heads * 2 * max(1, round(self.hidden_size / heads / 2))}"
            )
        if heads % kv_heads:
            raise ValueError(
                f"TinyModelSpec: num_key_value_heads {kv_heads} must divide num_attention_heads "
                f"{heads} (each key/value head serves a whole group of query heads)"
            )

    def cache_key(self, seed: int) -> str:
        payload = json.dumps(
            {
                "spec": asdict(self),
                "seed": seed,
                "corpus": hashlib.sha256(tiny_corpus().encode()).hexdigest(),
                "template": hashlib.sha256(CHATML_TEMPLATE.encode()).hexdigest(),
                "transformers": transformers.__version__,
                "format": 1,
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_tiny_model(
    seed: int = 0,
    spec: TinyModelSpec | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """A fresh tiny model (fp32, CPU, eval mode) and its tokenizer. The global RNG is untouched.

    `tokenizer` (default: `train_tiny_tokenizer` on the built-in corpus, `spec`'s vocab size)
    may be any tokenizer with the ChatML specials, e.g. one trained on a task's own text; the
    model's vocabulary is sized to it.
    """
    spec = spec or TinyModelSpec()
    if tokenizer is None:
        tokenizer = train_tiny_tokenizer(vocab_size=spec.tokenizer_vocab_size)
    im_end = _token_id(tokenizer, IM_END)
    pad = _token_id(tokenizer, ENDOFTEXT)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=[im_end, pad],
        pad_token_id=pad,
    )
    with torch.random.fork_rng(devices=[]):
        # the CPU generator alone: torch.manual_seed would reseed every GPU's too, unrestored
        torch.default_generator.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, pad], pad_token_id=pad, bos_token_id=None
    )
    return model.eval(), tokenizer


def _token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
        raise ValueError(
            f"the tokenizer has no {token!r} token: a tiny model needs the ChatML specials "
            f"{ENDOFTEXT!r} and {IM_END!r} (build it with ludic.models.train_tiny_tokenizer)"
        )
    return token_id


def default_cache_dir() -> Path:
    """`$LUDIC_CACHE_DIR`, else `~/.cache/ludic`."""
    env = os.environ.get("LUDIC_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ludic"


def tiny_model_dir(
    seed: int = 0,
    spec: TinyModelSpec | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """The directory of a saved tiny model, built on first use.

    The directory name hashes the spec, seed, corpus, template and transformers version, so a
    change to any of them builds a new model. Concurrent builders race safely: each writes a
    temporary directory and the first rename wins.
    """
    spec = spec or TinyModelSpec()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"tiny-{spec.cache_key(seed)}"
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        model, tokenizer = build_tiny_model(seed=seed, spec=spec)
        save_model(model, tokenizer, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tiny_model(
    seed: int = 0,
    spec: TinyModelSpec | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device = "cpu",
) -> tuple[transformers.PreTrainedModel, PreTrainedTokenizerBase]:
    """`load_model(tiny_model_dir(...))`: the cached tiny model, fp32."""
    return load_model(tiny_model_dir(seed, spec, cache_dir), dtype=torch.float32, device=device)
