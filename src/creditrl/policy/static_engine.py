"""A generation engine without per-step framework overhead: a pre-allocated KV cache and a
functional decoder forward over the HF model's own weights.

Decoding a ~1M-parameter model through ``model(...)`` costs about 10 ms per step on this CPU,
nearly all of it Python and dispatch overhead (mask building, cache objects, module hooks),
not arithmetic. :class:`StaticEngine` runs the same mathematics as the HF modules -- RMSNorm,
rotary embeddings from the model's own rotary module, grouped-query attention, gated MLP --
as a short sequence of tensor ops over fused weights (``q|k|v`` and ``gate|up`` concatenated)
and writes keys and values into one tensor allocated once per call:

* **static KV cache** ``(layers, 2, rows, kv_heads, width, head_dim)``; column ``j`` is column
  ``j`` of the left-padded batch, so every row writes the same column at each step;
* **shared-prefix prefill**: identical prompts (the ``n`` samples of a prompt, MC continuations
  of one prefix) are run through the prompt forward once and their cache rows copied;
* **early exit**: finished rows are compacted out of the cache once they are a quarter of it,
  so late steps run on the rows still decoding;
* the **log-probs** returned are those of the raw policy distribution (temperature 1, no top-p),
  taken from the same logits that were sampled from, so no second forward pass is needed.

Sampling consumes the generator exactly like :class:`~creditrl.policy.engine.HFEngine` (one
draw per request per step), so both engines give the same tokens for the same seed up to float
rounding. Supported architectures: Llama, Mistral (within its sliding window), Qwen2 and Qwen3;
:func:`make_engine` falls back to :class:`HFEngine` for anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.activations import ACT2FN

from creditrl.policy.engine import Generation, HFEngine, SamplingParams, left_pad, positions_from_mask, sample_next

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ENGINES = ("auto", "static", "hf")


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why :class:`StaticEngine` cannot run ``model`` (None when it can)."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type '{cfg.model_type}' is not one of {SUPPORTED_MODEL_TYPES}"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return f"sliding-window layers are not supported (layer_types={sorted(set(layer_types))})"
    if getattr(cfg, "hidden_act", "silu") not in ACT2FN:
        return f"unknown activation '{cfg.hidden_act}'"
    layer = model.model.layers[0]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not isinstance(getattr(layer.self_attn, name, None), torch.nn.Linear):
            return f"attention has no Linear '{name}'"
    for name in ("gate_proj", "up_proj", "down_proj"):
        if not isinstance(getattr(layer.mlp, name, None), torch.nn.Linear):
            return f"MLP has no Linear '{name}'"
    return None


def _cat_bias(*linears: torch.nn.Linear) -> torch.Tensor | None:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat([lin.bias if lin.bias is not None else torch.zeros(lin.out_features) for lin in linears])


def _eps(norm: torch.nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # the HF LlamaRMSNorm op order, so results agree bit for bit in fp32
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class _Layer:
    ln1: torch.Tensor
    eps1: float
    qkv: torch.Tensor  # (q + 2 kv, hidden) fused projection
    qkv_bias: torch.Tensor | None
    q_norm: tuple[torch.Tensor, float] | None  # Qwen3 per-head RMSNorm
    k_norm: tuple[torch.Tensor, float] | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    ln2: torch.Tensor
    eps2: float
    gate_up: torch.Tensor  # (2 * intermediate, hidden)
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


class _Decoder:
    """The model's weights, fused, and its forward as plain tensor ops (inference only)."""

    def __init__(self, model: PreTrainedModel) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"StaticEngine cannot run this model: {reason}")
        cfg = model.config
        base = model.model
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim**-0.5
        self.act = ACT2FN[cfg.hidden_act]
        self.window = getattr(cfg, "sliding_window", None) if cfg.model_type == "mistral" else None
        self.embed = base.embed_tokens.weight
        self.norm, self.norm_eps = base.norm.weight, _eps(base.norm)
        self.lm_head = model.lm_head.weight
        self.lm_head_bias = model.lm_head.bias
        self.rotary = base.rotary_emb
        self.layers = []
        for layer in base.layers:
            at, mlp = layer.self_attn, layer.mlp
            qn, kn = getattr(at, "q_norm", None), getattr(at, "k_norm", None)
            self.layers.append(
                _Layer(
                    ln1=layer.input_layernorm.weight,
                    eps1=_eps(layer.input_layernorm),
                    qkv=torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]),
                    qkv_bias=_cat_bias(at.q_proj, at.k_proj, at.v_proj),
                    q_norm=None if qn is None else (qn.weight, _eps(qn)),
                    k_norm=None if kn is None else (kn.weight, _eps(kn)),
                    o=at.o_proj.weight,
                    o_bias=at.o_proj.bias,
                    ln2=layer.post_attention_layernorm.weight,
                    eps2=_eps(layer.post_attention_layernorm),
                    gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                    gate_up_bias=_cat_bias(mlp.gate_proj, mlp.up_proj),
                    down=mlp.down_proj.weight,
                    down_bias=mlp.down_proj.bias,
                )
            )
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv * self.head_dim

    def rope_table(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (width, head_dim) from the model's own rotary module."""
        pos = torch.arange(width)[None]
        cos, sin = self.rotary(self.embed[:1], pos)
        return cos[0], sin[0]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T * scale, masked) v; q (b, heads, s, d), k and v (b, kv, width, d)."""
        if self.n_kv != self.n_heads:  # grouped-query attention: each kv head serves a group
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scale)
        scores = scores.masked_fill_(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def forward(
        self,
        ids: torch.Tensor,  # (b, s)
        cos: torch.Tensor,  # (b, s, head_dim) at each token's position
        sin: torch.Tensor,
        cache: torch.Tensor,  # (L, 2, b, kv, width, head_dim), written in columns [start, start + s)
        start: int,
        mask: torch.Tensor,  # bool (b, 1, s, start + s): which cached columns each query sees
        last_only: bool,
    ) -> torch.Tensor:
        """Logits (b, V) of the last position (``last_only``) or (b, s, V)."""
        b, s = ids.shape
        h = F.embedding(ids, self.embed)
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        end = start + s
        for i, ly in enumerate(self.layers):
            x = _rms(h, ly.ln1, ly.eps1)
            qkv = F.linear(x, ly.qkv, ly.qkv_bias)
            q = qkv[..., : self.q_size].view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
            k = qkv[..., self.q_size : self.q_size + self.kv_size].view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
            v = qkv[..., self.q_size + self.kv_size :].view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
            if ly.q_norm is not None:
                q = _rms(q, *ly.q_norm)
            if ly.k_norm is not None:
                k = _rms(k, *ly.k_norm)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache[i, 0, :, :, start:end] = k
            cache[i, 1, :, :, start:end] = v
            attn = self._attend(q, cache[i, 0, :, :, :end], cache[i, 1, :, :, :end], mask)
            h = h + F.linear(attn.transpose(1, 2).reshape(b, s, self.q_size), ly.o, ly.o_bias)
            x = _rms(h, ly.ln2, ly.eps2)
            gu = F.linear(x, ly.gate_up, ly.gate_up_bias)
            inter = gu.shape[-1] // 2
            h = h + F.linear(self.act(gu[..., :inter]) * gu[..., inter:], ly.down, ly.down_bias)
        if last_only:
            h = h[:, -1]
        return F.linear(_rms(h, self.norm, self.norm_eps), self.lm_head, self.lm_head_bias).float()


class StaticEngine:
    """Fast batched sampling for Llama-family HF models (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, *, eos_id: int, pad_id: int, compact_at: float = 0.75) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"StaticEngine cannot run this model: {reason}")
        if not 0 < compact_at <= 1:
            raise ValueError(f"compact_at must be in (0, 1], got {compact_at}")
        self.model = model
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.compact_at = compact_at

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        budgets: Sequence[int] | None = None,
    ) -> Generation:
        if n < 1 or not prompts:
            raise ValueError(f"need at least one prompt and n >= 1, got {len(prompts)} prompts, n={n}")
        if budgets is not None and (len(budgets) != len(prompts) or min(budgets) < 1):
            raise ValueError(f"budgets: need one budget >= 1 per prompt ({len(prompts)}), got {list(budgets)}")
        requests = [list(p) for p in prompts for _ in range(n)]
        if any(len(p) == 0 for p in requests):
            raise ValueError("every prompt needs at least one token (e.g. bos)")
        dec = _Decoder(self.model)  # weights are read afresh: the policy changes between calls
        n_req = len(requests)
        cap = params.max_new_tokens
        limit = torch.tensor([min(cap, b) for b in budgets for _ in range(n)]) if budgets else torch.full((n_req,), cap)
        steps = int(limit.max())

        # Shared-prefix prefill: one forward per distinct prompt, cache rows copied to requests.
        uniq: dict[tuple[int, ...], int] = {}
        row_of = torch.tensor([uniq.setdefault(tuple(p), len(uniq)) for p in requests])
        ids, attn = left_pad([list(p) for p in uniq], self.pad_id)
        width = ids.shape[1]
        total = width + steps
        longest = max(len(p) for p in requests) + steps - 1  # the last sampled token is never fed back
        if dec.window is not None and longest > dec.window:
            raise ValueError(f"sequence length {longest} exceeds Mistral sliding_window={dec.window}; use engine 'hf'")
        cos_t, sin_t = dec.rope_table(total)
        pos = positions_from_mask(attn)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        pmask = (causal[None] & attn.bool()[:, None, :])[:, None]  # (u, 1, w, w)
        # A fully padded query row (left padding) would attend to nothing; let it see itself.
        pmask = pmask | torch.eye(width, dtype=torch.bool)[None, None]
        pcache = torch.zeros(len(dec.layers), 2, len(uniq), dec.n_kv, width, dec.head_dim, dtype=dec.embed.dtype)
        plogits = dec.forward(ids, cos_t[pos], sin_t[pos], pcache, 0, pmask, last_only=True)

        cache = torch.empty(len(dec.layers), 2, n_req, dec.n_kv, total, dec.head_dim, dtype=dec.embed.dtype)
        cache[:, :, :, :, :width] = pcache[:, :, row_of]
        del pcache
        seen = torch.zeros(n_req, total, dtype=torch.bool)  # which cache columns hold real tokens
        seen[:, :width] = attn.bool()[row_of]
        next_pos = pos[row_of, -1] + 1
        logits = plogits[row_of].clone()

        finished = torch.zeros(n_req, dtype=torch.bool)
        done = finished.clone()
        active = torch.arange(n_req)  # requests whose rows are in the cache, in cache order
        live = torch.ones(n_req, dtype=torch.bool)  # per cache row: still decoding
        tokens = torch.full((n_req, steps), self.pad_id, dtype=torch.long)
        logps = torch.zeros(n_req, steps)
        for step in range(steps):
            # one draw per request per step, as HFEngine does, so the random stream is the same
            tok = sample_next(logits, params, generator)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            tokens[:, step] = tok
            logps[:, step] = torch.log_softmax(logits, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
            finished = finished | ((tok == self.eos_id) & ~done)
            done = finished | (limit <= step + 1)
            if bool(done.all()):
                break
            live = ~done[active]
            n_live = int(live.sum())
            if n_live < len(active) and n_live <= self.compact_at * len(active):
                keep = live.nonzero().squeeze(-1)
                cache = cache[:, :, keep]
                active, seen, next_pos, live = active[keep], seen[keep], next_pos[keep], live[keep]
            col = width + step
            seen[:, col] = True
            mask = seen[:, None, None, : col + 1]
            out = dec.forward(
                tok[active][:, None], cos_t[next_pos][:, None], sin_t[next_pos][:, None], cache, col, mask, last_only=True
            )
            logits[active] = out
            next_pos = next_pos + 1
        out_tokens, out_logps, ended = [], [], []
        for row_t, row_l, lim in zip(tokens.tolist(), logps.tolist(), limit.tolist()):
            row_t, row_l = row_t[:lim], row_l[:lim]
            length = row_t.index(self.eos_id) + 1 if self.eos_id in row_t else len(row_t)
            out_tokens.append(row_t[:length])
            out_logps.append(row_l[:length])
            ended.append(self.eos_id in row_t)
        return Generation(
            prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
            prompt_ids=requests,
            tokens=out_tokens,
            logprobs=out_logps,
            finished=ended,
        )


def make_engine(model: PreTrainedModel, *, eos_id: int, pad_id: int, kind: str = "auto"):
    """``static`` (error if unsupported), ``hf``, or ``auto``: static when the model allows."""
    if kind not in ENGINES:
        raise ValueError(f"policy.engine: expected one of {ENGINES}, got '{kind}'")
    if kind == "hf" or (kind == "auto" and unsupported_reason(model) is not None):
        return HFEngine(model, eos_id=eos_id, pad_id=pad_id)
    return StaticEngine(model, eos_id=eos_id, pad_id=pad_id)
