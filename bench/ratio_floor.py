"""Benchmark: where the float32 on-policy ratio's distance from 1 comes from (default, fast path).

The embedded engine (default, not batch-invariant) samples completions on the tiny model; the
trainer recomputes their logprobs with `sequence_logprobs` (transformers forward, right-padded
batch, train mode). On the first, on-policy step the log ratio is pure arithmetic: this script
splits it by cause, as the max |difference in token logprob| (under the sampling transform,
completion tokens only) between two ways of computing the same positions:

- `end_to_end_alone` / `end_to_end_batched`: engine (requests one at a time / all at once) vs
  trainer: what `loss/mismatch/abs_log_ratio_max` shows.
- `implementation`: the engine's lean forward run over the whole sequence vs the transformers
  forward of that one row (RMSNorm, rotary, fused projections, SDPA masking), and the engine's
  sampling transform vs the trainer's on the same logits (temperature division, top-p support,
  log-softmax). 0 means the two sides run the same op sequence.
- `engine_decode`: the engine's prefill + one-token decode steps vs the full forward of the
  same row, emulated op by op (`emulation_exact`: the emulation equals the engine's own
  logprobs bit for bit); then with only the GEMMs (`gemms_only`, and each GEMM alone) or only
  the attention (`attention_only`) computed as a decode step does, the rest as the full
  forward; `gemms_on_16_rows` pads each decode row's GEMMs to 16 rows (the batch-invariant
  mode's GEMM form) and keeps the decode attention.
- `trainer_batch`: the trainer's batched right-padded forward vs each row alone;
  `attention_keys_padded` is the row alone with its attention keys padded (masked) to the
  batch width, the only thing batching changes for a row's arithmetic.
- `log_softmax_float64`: engine vs trainer with the transform done in float64 on the same
  float32 logits (the log-softmax's own share).

Prints one JSON object: each measure's max over model seeds x prompt sets, per sampling
setting. Run: `python bench/ratio_floor.py [--seeds 2] [--max-tokens 30]`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os

import torch
import torch.nn.functional as F
from _args import show_defaults

from ludic.inference import ChatRequest, ChatResponse, SamplingConfig
from ludic.inference.embedded import lean_forward as lf
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.embedded.token_sampling import RowKnobs
from ludic.models import build_tiny_model
from ludic.training.collate import CollatedBatch, TokenSampling
from ludic.training.logprobs import processed_logits, sequence_logprobs

GEMMS = ("qkv", "o", "gate_up", "down", "lm_head")
Modes = dict[str, str]  # op -> "full" | "decode" | "pad16"; "attn" -> "full" | "decode" | "padW"


def _requests(prompts: int, set_index: int, sampling: tuple[float, float], max_tokens: int):
    temperature, top_p = sampling
    out = []
    for i in range(prompts):
        config = SamplingConfig(
            temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=100 * set_index + i
        )
        content = "Board: " + "X O " * (3 * i + set_index) + f"move {i}"
        out.append(ChatRequest(messages=[{"role": "user", "content": content}], sampling=config))
    return out


def _generate(model, tokenizer, requests, together: bool) -> list[ChatResponse]:
    async def run() -> list[ChatResponse]:
        with EmbeddedEngine(copy.deepcopy(model), tokenizer) as engine:
            if together:
                return list(await asyncio.gather(*(engine.complete(r) for r in requests)))
            return [await engine.complete(r) for r in requests]

    return asyncio.run(run())


def _batch(responses: list[ChatResponse], sampling: tuple[float, float]) -> CollatedBatch:
    rows = [[*r.prompt_token_ids, *r.completion_token_ids] for r in responses]
    B, T = len(rows), max(map(len, rows))
    ids_BT, mask_BT = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    temperature_BT, top_p_BT = torch.ones(B, T), torch.ones(B, T)
    for b, row in enumerate(rows):
        ids_BT[b, : len(row)], mask_BT[b, : len(row)] = torch.tensor(row), 1
        start = len(responses[b].prompt_token_ids)
        temperature_BT[b, start : len(row)], top_p_BT[b, start : len(row)] = sampling
    return CollatedBatch(
        input_ids_BT=ids_BT,
        attention_mask_BT=mask_BT,
        action_mask_BT=mask_BT.float(),
        advantages_B=torch.zeros(B),
        sampling=TokenSampling(
            temperature_BT=temperature_BT,
            top_k_BT=torch.full((B, T), -1, dtype=torch.long),
            top_p_BT=top_p_BT,
        ),
    )


def _transform(logits_LV, targets_L, sampling, dtype=torch.float32) -> torch.Tensor:
    """The engine's sampling transform (`RowKnobs.logprobs`) at the targets."""
    n = len(targets_L)
    knobs = RowKnobs.of([sampling[0]] * n, [-1] * n, [sampling[1]] * n, logits_LV.shape[-1])
    if dtype == torch.float64:
        scaled = logits_LV.double() / sampling[0]
        kept = knobs.logprobs(logits_LV) > float("-inf")  # the float32 support
        lp = torch.log_softmax(scaled.masked_fill(~kept, float("-inf")), -1)
    else:
        lp = knobs.logprobs(logits_LV)
    return lp.gather(-1, targets_L[:, None]).squeeze(-1)


def _gemm(x_NE, weight, mode: str, start: int, transposed_ok: bool = False) -> torch.Tensor:
    """Rows before `start` as one prefill GEMM; later rows as the full forward ("full"), one
    decode step each ("decode", one row), or one row padded to 16 ("pad16")."""
    if mode == "full":
        return lf._matmul(x_NE, weight, None, transposed_ok)
    head = [lf._matmul(x_NE[:start], weight, None, transposed_ok)] if start else []
    rows = [x_NE[i : i + 1] for i in range(start, len(x_NE))]
    if mode == "decode":
        return torch.cat(head + [lf._matmul(r, weight, None, transposed_ok) for r in rows])
    return torch.cat(head + [F.linear(F.pad(r, (0, 0, 0, 15)), weight)[:1] for r in rows])


def _attend(q_1HLD, k_1KLD, v_1KLD, lean, mode: str, prompt: int) -> torch.Tensor:
    L, group = q_1HLD.shape[2], lean.heads != lean.kv_heads

    def sdpa(q, k, v, S):
        mask = lf._additive(
            lf._attention_mask(torch.ones(1, k.shape[2], dtype=torch.bool), S), q.dtype
        )
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=lean.scaling, enable_gqa=group
        )

    if mode == "full":
        return sdpa(q_1HLD, k_1KLD, v_1KLD, L)
    if mode.startswith("pad"):  # keys padded (masked) to the batch width, as in the trainer
        width = int(mode[3:])
        k, v = (F.pad(t, (0, 0, 0, width - L)) for t in (k_1KLD, v_1KLD))
        mask = lf._additive(lf._attention_mask(torch.ones(1, L, dtype=torch.bool), L), q_1HLD.dtype)
        mask = F.pad(mask, (0, width - L), value=float("-inf"))
        return F.scaled_dot_product_attention(
            q_1HLD, k, v, attn_mask=mask, scale=lean.scaling, enable_gqa=group
        )
    outs = [
        sdpa(
            q_1HLD[:, :, :prompt],
            k_1KLD[:, :, :prompt].contiguous(),
            v_1KLD[:, :, :prompt].contiguous(),
            prompt,
        )
    ]
    for t in range(prompt, L):  # a decode step: one query over the cached keys
        q = q_1HLD[:, :, t : t + 1].transpose(1, 2).contiguous().transpose(1, 2)
        k, v = k_1KLD[:, :, : t + 1].contiguous(), v_1KLD[:, :, : t + 1].contiguous()
        outs.append(sdpa(q, k, v, 1))
    return torch.cat(outs, dim=2)


@torch.inference_mode()
def _forward(lean: lf.LeanForward, seq: list[int], prompt: int, modes: Modes) -> torch.Tensor:
    """The lean forward's arithmetic over one row, each op computed as `modes` says -> logits
    of the positions that predict the completion [n, V]."""
    L, H, K, D = len(seq), lean.heads, lean.kv_heads, lean.head_dim
    h = F.embedding(torch.tensor(seq), lean.embed.weight)
    cos, sin = lean.rotary(h, torch.arange(L)[None])
    cos, sin = cos.reshape(L, 1, D), sin.reshape(L, 1, D)
    for layer in lean.layers:
        x = lf._rms_norm(h, layer.input_norm)
        qkv = _gemm(x, layer.qkv._weight, modes["qkv"], prompt).view(L, -1, D)
        qk = lf._rotate(qkv[:, : H + K], cos, sin)
        q = qk[:, :H].view(1, L, H, D).transpose(1, 2)
        k = qk[:, H:].view(1, L, K, D).transpose(1, 2)
        v = qkv[:, H + K :].view(1, L, K, D).transpose(1, 2)
        out = _attend(q, k, v, lean, modes["attn"], prompt).transpose(1, 2).reshape(L, -1)
        h = h + _gemm(out, layer.o.weight, modes["o"], prompt, True)
        gu = _gemm(
            lf._rms_norm(h, layer.post_norm), layer.gate_up._weight, modes["gate_up"], prompt, True
        )
        g, u = gu.chunk(2, dim=-1)
        h = h + _gemm(lean.act(g) * u, layer.down.weight, modes["down"], prompt, True)
    # the engine's prefill runs lm_head on its last position alone, a decode step on its one
    logits = _gemm(lf._rms_norm(h, lean.norm), lean.lm_head.weight, modes["lm_head"], prompt - 1)
    return logits[prompt - 1 : L - 1].float()


def _modes(default: str = "full", attn: str = "full", **ops: str) -> Modes:
    return {**{g: default for g in GEMMS}, "attn": attn, **ops}


def _hf_row(model, seq: list[int], prompt: int) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
    return logits[prompt - 1 : len(seq) - 1].detach().float()


def _measure(model, tokenizer, set_index: int, sampling, args) -> dict[str, float]:
    requests = _requests(args.prompts, set_index, sampling, args.max_tokens)
    alone = _generate(model, tokenizer, requests, together=False)
    together = _generate(model, tokenizer, requests, together=True)
    model.train()
    trainer_BT = {}
    for name, responses in (("alone", alone), ("batched", together)):
        trainer_BT[name] = sequence_logprobs(model, _batch(responses, sampling))[0].detach()
    lean = lf.LeanForward.for_model(copy.deepcopy(model))
    assert lean is not None
    width = max(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in alone)
    variants: dict[str, Modes] = {
        "engine_decode/total": _modes("decode", "decode"),
        "engine_decode/gemms_only": _modes("decode"),
        "engine_decode/attention_only": _modes(attn="decode"),
        **{f"engine_decode/{g}_only": _modes(**{g: "decode"}) for g in GEMMS},
        "engine_decode/gemms_on_16_rows": _modes("pad16", "decode"),
        "trainer_batch/attention_keys_padded": _modes(attn=f"pad{width}"),
    }
    worst: dict[str, float] = {}

    def note(key: str, a: torch.Tensor, b: torch.Tensor) -> None:
        worst[key] = max(worst.get(key, 0.0), float((a - b).abs().max()))

    for name, responses in (("alone", alone), ("batched", together)):
        for b, r in enumerate(responses):
            n, start = len(r.completion_token_ids), len(r.prompt_token_ids)
            behaviour = torch.tensor(r.completion_logprobs)
            note(f"end_to_end_{name}", behaviour, trainer_BT[name][b, start : start + n])
    for b, r in enumerate(alone):
        prompt, seq = len(r.prompt_token_ids), [*r.prompt_token_ids, *r.completion_token_ids]
        targets = torch.tensor(r.completion_token_ids)
        behaviour = torch.tensor(r.completion_logprobs)
        trainer = trainer_BT["alone"][b, prompt : len(seq)]
        row_logits = _hf_row(model, seq, prompt)
        row = _transform(row_logits, targets, sampling)
        full = _forward(lean, seq, prompt, _modes())
        note("implementation/lean_vs_transformers_row", _transform(full, targets, sampling), row)
        ones = torch.ones(len(targets))
        trainer_side = torch.log_softmax(
            processed_logits(
                row_logits, targets, sampling[0] * ones, -ones.long(), sampling[1] * ones
            ),
            -1,
        ).gather(-1, targets[:, None])[:, 0]
        note("implementation/transform_engine_vs_trainer", trainer_side, row)
        for key, modes in variants.items():
            lp = _transform(_forward(lean, seq, prompt, modes), targets, sampling)
            note(key, lp, trainer if key.startswith("trainer") else row)
        decode_logits = _forward(lean, seq, prompt, variants["engine_decode/total"])
        note(
            "engine_decode/emulation_exact", _transform(decode_logits, targets, sampling), behaviour
        )
        note("trainer_batch/total", trainer, row)
        note(
            "log_softmax_float64",
            _transform(decode_logits, targets, sampling, torch.float64),
            _transform(row_logits, targets, sampling, torch.float64),
        )
        note("log_softmax_float32_same_pair", _transform(decode_logits, targets, sampling), row)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=2, help="model seeds and prompt sets each")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=30)
    args = show_defaults(parser).parse_args()
    result: dict[str, object] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loadavg": os.getloadavg()[0],
    }
    for sampling in ((0.7, 0.9), (1.0, 1.0)):
        total: dict[str, float] = {}
        for model_seed in range(args.seeds):
            model, tokenizer = build_tiny_model(seed=model_seed)
            for set_index in range(args.seeds):
                for key, value in _measure(model, tokenizer, set_index, sampling, args).items():
                    total[key] = max(total.get(key, 0.0), value)
        result[f"T{sampling[0]}_top_p{sampling[1]}"] = {
            k: float(f"{v:.2e}") for k, v in sorted(total.items())
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
