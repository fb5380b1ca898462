"""The static engine's decoder: an HF Llama-family model's own weights, fused (``q|k|v`` and
``gate|up`` concatenated), and its forward as plain tensor ops, inference only.

:meth:`Decoder.forward` runs the prompt prefill (and the tensor-op decode step);
:meth:`Decoder.decode_fused` runs one decode step through the compiled kernels
(:mod:`creditrl.policy.engines.kernels`). Each stores keys/values and attends through a callback, so the
caller (:class:`~creditrl.policy.engines.static.StaticEngine`, with the caches of
:mod:`creditrl.policy.engines.kv_cache`) owns the cache. The mathematics is that of the HF modules --
RMSNorm, rotary embeddings from the model's own rotary module, grouped-query attention, gated
MLP -- and :func:`unsupported_reason` says when a model is outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.activations import ACT2FN

from creditrl.policy.device import module_device
from creditrl.policy.engines import kernels as compiled

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# from this hidden size the compiled decode step runs its products through oneDNN on weights reordered
# once per call (Decoder.prepack); below it the products are too small for the primitive's fixed cost
ONEDNN_FROM_HIDDEN = 256


def onednn_available() -> bool:
    """Whether this torch has oneDNN's CPU linear on reordered weights (``torch.ops.mkldnn``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` through oneDNN on ``packed = reorder_weight(w)`` (or on ``w`` itself,
    which oneDNN then reorders at every call)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def reorder_weight(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w`` (out, in) in oneDNN's blocked layout for products of about ``rows`` rows (an opaque tensor
    for :func:`onednn_linear`)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows)


def unsupported_reason(model: PreTrainedModel, *, cpu_only: bool = True) -> str | None:
    """Why :class:`StaticEngine` cannot run ``model`` (None when it can). ``cpu_only=False``: the
    same mathematics on any device (the compiled engine's decoder)."""
    if hasattr(model, "peft_config"):
        return "the model carries peft (LoRA) adapters, which the fused plain weights would ignore"
    if cpu_only and module_device(model).type != "cpu":
        return f"it is written for the CPU and the model is on '{module_device(model)}' (use hf or vllm there)"
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
    return torch.cat([lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears])


def _eps(norm: torch.nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, w, bias) if packed is None else onednn_linear(x, packed, bias)


def _add_linear(
    h: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    """``h + F.linear(x, w, bias)``, the residual add folded into the product (``addmm``, or oneDNN's
    binary post-op on ``packed``)."""
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, h, packed, bias, "add")
    return torch.addmm(h, x, w.t()) if bias is None else h + F.linear(x, w, bias)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # the HF LlamaRMSNorm op order, so results agree bit for bit in fp32
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated, once per pass: HF's ``rotate_half(x) * sin``, i.e.
    ``cat(-x2, x1) * sin``, is then ``x.roll(half) * signed``, the same bits (a product's sign is its
    operands'), and the roll's gradient is one op."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, signed: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of ``x`` at the positions of ``cos`` and :func:`signed_sin`."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed


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
    packed: tuple[torch.Tensor, ...] | None = None  # (qkv, o, gate_up, down) for oneDNN (Decoder.prepack)


class Decoder:
    """The model's weights, fused, and its forward as plain tensor ops (inference only)."""

    def __init__(self, model: PreTrainedModel, *, cpu_only: bool = True) -> None:
        reason = unsupported_reason(model, cpu_only=cpu_only)
        if reason is not None:
            raise ValueError(f"StaticEngine cannot run this model: {reason}")
        cfg = model.config
        base = model.model
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim**-0.5
        self.act = ACT2FN[cfg.hidden_act]
        self.hidden_act = cfg.hidden_act
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
        self.hidden_size = cfg.hidden_size
        self.packed_head: torch.Tensor | None = None

    def prepack(self, rows: int) -> None:
        """Reorder the decode step's weights once for oneDNN (float32; :func:`onednn_available`), so
        :meth:`decode_fused` runs its products through oneDNN's linear for about ``rows`` rows: the
        same products in another summation order (float rounding; tested against the plain step)."""
        for ly in self.layers:
            ly.packed = tuple(reorder_weight(w, rows) for w in (ly.qkv, ly.o, ly.gate_up, ly.down))
        self.packed_head = reorder_weight(self.lm_head, rows)

    def rope_table(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (width, head_dim) from the model's own rotary module."""
        pos = torch.arange(width, device=self.embed.device)[None]
        cos, sin = self.rotary(self.embed[:1], pos)
        return cos[0], sin[0]

    def _heads(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Grouped-query attention: repeat each kv head for the query heads it serves."""
        return x if self.n_kv == self.n_heads else x.repeat_interleave(self.n_heads // self.n_kv, dim=dim)

    def prompt_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Causal attention within left-padded prompts; q, k, v (u, heads|kv, w, d), bias (u, 1, w, w)."""
        scores = torch.matmul(q, self._heads(k, 1).transpose(-1, -2)).mul_(self.scale).add_(bias)
        return torch.matmul(torch.softmax(scores, dim=-1), self._heads(v, 1))

    def decode_attend(
        self,
        q: torch.Tensor,  # (b, heads, 1, d): one new token per row
        kp: torch.Tensor,  # (b, kv, P, d): the row's prompt keys
        vp: torch.Tensor,
        kr: torch.Tensor,  # (b, kv, t, d): the response tokens so far, this one included
        vr: torch.Tensor,
        pbias: torch.Tensor,  # (b, 1, 1, P): 0 on real prompt columns, -inf on left padding
    ) -> torch.Tensor:
        """One softmax over [prompt columns, response columns] of one query token, then the values."""
        s_p = torch.matmul(q, self._heads(kp, 1).transpose(-1, -2)).mul_(self.scale).add_(pbias)
        s_r = torch.matmul(q, self._heads(kr, 1).transpose(-1, -2)).mul_(self.scale)
        probs = torch.softmax(torch.cat([s_p, s_r], dim=-1), dim=-1)
        width = s_p.shape[-1]
        return torch.matmul(probs[..., :width], self._heads(vp, 1)) + torch.matmul(
            probs[..., width:], self._heads(vr, 1)
        )

    @property
    def fusable(self) -> bool:
        """Whether :meth:`decode_fused` can run this model (no q/k norms, SiLU MLP)."""
        first = self.layers[0]
        return first.q_norm is None and first.k_norm is None and self.hidden_act == "silu"

    def decode_fused(
        self,
        tok: torch.Tensor,  # (b,) one new token per row
        attend: Callable[[int, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Logits (b, V) of one decode step through the compiled kernels (float32): RMSNorm and
        the gated SiLU in one pass each, residual adds folded into the products (``addmm``, or
        oneDNN's add after :meth:`prepack`, whose reordered weights the products then run on), and
        ``attend(layer, qkv)`` the rotary embedding, cache write and attention of a layer
        (:func:`~creditrl.policy.engines.kernels.rope_cache_attend`), returning (b, heads * d)."""
        h = F.embedding(tok, self.embed)
        for i, ly in enumerate(self.layers):
            w = ly.packed or (None,) * 4
            qkv = _linear(compiled.rms_norm(h, ly.ln1, ly.eps1), ly.qkv, ly.qkv_bias, w[0])
            h = _add_linear(h, attend(i, qkv), ly.o, ly.o_bias, w[1])
            gu = _linear(compiled.rms_norm(h, ly.ln2, ly.eps2), ly.gate_up, ly.gate_up_bias, w[2])
            h = _add_linear(h, compiled.silu_mul(gu), ly.down, ly.down_bias, w[3])
        last = compiled.rms_norm(h, self.norm, self.norm_eps)
        return _linear(last, self.lm_head, self.lm_head_bias, self.packed_head)

    def forward(
        self,
        ids: torch.Tensor,  # (b, s)
        cos: torch.Tensor,  # (b, s, head_dim) at each token's position
        sin: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Logits (b, V) of the last position. ``attend(layer, q, k, v)`` stores the layer's new
        keys/values wherever the caller keeps its cache and returns the attention output."""
        b, s = ids.shape
        h = F.embedding(ids, self.embed)
        cos, sin = cos[:, None], signed_sin(sin[:, None])  # broadcast over heads
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
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
            attn = attend(i, q, k, v)
            h = h + F.linear(attn.transpose(1, 2).reshape(b, s, self.q_size), ly.o, ly.o_bias)
            x = _rms(h, ly.ln2, ly.eps2)
            gu = F.linear(x, ly.gate_up, ly.gate_up_bias)
            inter = gu.shape[-1] // 2
            h = h + F.linear(self.act(gu[..., :inter]) * gu[..., inter:], ly.down, ly.down_bias)
        return F.linear(_rms(h[:, -1], self.norm, self.norm_eps), self.lm_head, self.lm_head_bias).float()
