"""A tiny model whose tokenizer is trained on the task's own text, built from scratch.

`ludic.models.build_tiny_model` trains its BPE on a fixed general corpus, where a tic-tac-toe
observation costs ~120 tokens; adding the env's observations to that corpus makes the same
prompt ~70 tokens, which halves the CPU time of every rollout and training step. Same
architecture, chat template and special tokens as `build_tiny_model`; weights are random.
"""

from __future__ import annotations

import asyncio
import random

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ludic.envs import TicTacToeEnv, random_move
from ludic.models import TinyModelSpec, train_tiny_tokenizer
from ludic.models.corpus import tiny_corpus
from ludic.models.tokenizer import ENDOFTEXT, IM_END


def tictactoe_corpus(games: int = 200, seed: int = 0) -> str:
    """The tiny corpus plus every observation of `games` random games of TicTacToeEnv."""
    rng = random.Random(seed)
    lines = [tiny_corpus()]
    for game in range(games):
        env = TicTacToeEnv(opponent="random")
        lines.append(asyncio.run(env.reset(seed=game))[env.agent_id][0])
        while env.outcome is None:
            move = random_move(env.board, rng)
            lines.append(asyncio.run(env.step({env.agent_id: str(move)}))[env.agent_id].obs)
        lines.append(f"<move>{rng.randint(1, 9)}</move>")
    return "\n".join(lines)


def build_task_model(
    corpus: str, *, seed: int = 0, spec: TinyModelSpec | None = None
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """A fresh tiny Llama (fp32, CPU, eval mode) with a BPE tokenizer trained on `corpus`."""
    spec = spec or TinyModelSpec()
    tokenizer = train_tiny_tokenizer(vocab_size=spec.tokenizer_vocab_size, corpus=corpus)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    assert isinstance(im_end, int) and isinstance(pad, int)
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
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, pad], pad_token_id=pad, bos_token_id=None
    )
    return model.eval(), tokenizer
