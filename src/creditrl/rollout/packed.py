"""The response forward over packed tokens: the same logits as the HF pass, without the padding.

The HF pass (:func:`creditrl.rollout.batch._shared_prompt_forward`) computes every padded
position of every row. This pass runs the Llama-family mathematics (RMSNorm, rotary embeddings
from the model's own rotary module, grouped-query attention, gated MLP; the op order of the HF
modules) on the model's own parameters, so it is differentiable and serves the update as well as
the reference log-probs:

1. each distinct prompt once, left-padded ``(u, P)``, keeping every layer's keys and values;
2. the response inputs of every row *packed*: only the ``L_i - 1`` real tokens that emit a
   response token (the last prompt position emits the first), ``(N, H)`` with ``N = sum L_i - B``,
   through every projection and MLP -- the products that cost almost all of the FLOPs;
3. attention per row over [its prompt's real keys, its own response keys so far]: the rows of
   each prompt length in one pass over ``[real prompt, response]`` positions, gathered from and
   back to the packed rows -- masked for short responses, causal for long ones, where the kernel's
   skipping of the upper triangle matters as these products outgrow the projections.

:func:`packed_reason` says when a model or call is outside it (then the HF pass runs); the
outputs agree with the HF pass to float rounding (tests compare them, and their gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from creditrl.policy.device import is_fsdp
from creditrl.policy.engines.decoder import rotary, signed_sin, unsupported_reason

__all__ = ["packed_reason", "packed_response_logits"]


def _rms(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def packed_reason(model: torch.nn.Module, width: int) -> str | None:
    """Why the packed pass cannot stand in for the HF pass on ``model`` for a call of ``width``
    (prompt + response) positions, in one line; None when it can."""
    if not isinstance(model, PreTrainedModel):
        return f"the module is a {type(model).__name__}, not a plain Hugging Face model"
    if is_fsdp(model):
        return "the model is sharded (FSDP2)"
    reason = unsupported_reason(model)
    if reason is not None:
        return reason
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return "the weights are not float32"
    if torch.is_autocast_enabled("cpu"):
        return "autocast is on (policy.precision)"
    cfg = model.config
    if model.training and float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention dropout is on"
    if any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        return "gradient checkpointing is on"
    window = getattr(cfg, "sliding_window", None) if cfg.model_type == "mistral" else None
    if window is not None and width > window:
        return f"the sliding window ({window}) is shorter than the sequence ({width})"
    return None


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, kv, s, d) -> (b, heads, s, d): each kv head repeated for the query heads it serves."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


@dataclass
class _Layout:
    """Where the packed response inputs sit: packed input n is row ``rows[n]``, column ``cols[n]``
    of the (B, T-1) inputs (token j emits token j + 1)."""

    rows: torch.Tensor  # (N,)
    cols: torch.Tensor  # (N,)
    prompt_bias: torch.Tensor  # (u, 1, P, P): causal within each distinct prompt, 0 or -inf-like
    groups: list[_LengthGroup]  # the rows of each real prompt length, for the response attention
    unpack: torch.Tensor  # (N,): index into the groups' outputs (sum of rows x (T-1))


@dataclass
class _LengthGroup:
    """The rows whose real prompt length is ``n``: their inputs' packed indices ``gather`` (rows,
    T-1) -- past a row's end any index (those queries' outputs are dropped and causality keeps those
    keys from every real query) -- and, for short responses, the mask ``allowed`` (T-1, n + T-1):
    query i sees the n prompt keys and the response keys up to its own. Without it the pass is
    causal over all n + T-1 positions, with zero queries at the prompt's (their outputs dropped):
    more products, but the causal kernel skips the upper triangle, which makes it the cheaper one
    past :data:`MASKED_UP_TO` response inputs."""

    n: int
    idx: torch.Tensor  # (g,) the rows
    gather: torch.Tensor  # (g, T-1) into the packed inputs
    live: torch.Tensor  # (g, T-1) bool: the entries of ``gather`` within their row
    targets: torch.Tensor  # gather[live]: the packed inputs they hold, each once (the gather's gradient)
    allowed: torch.Tensor | None  # (T-1, n + T-1) bool, or None: causal over [prompt, response]


MASKED_UP_TO = 128  # response inputs (T-1) up to which the masked attention runs, not the causal one


def _layout(prompt_mask: torch.Tensor, response_lengths: torch.Tensor, first: torch.Tensor, t: int) -> _Layout:
    p = prompt_mask.shape[1]
    device = prompt_mask.device
    live = torch.arange(max(t - 1, 0), device=device)[None, :] < (response_lengths[:, None] - 1)  # (B, T-1)
    rows, cols = live.nonzero(as_tuple=True)
    p_real = prompt_mask.bool()
    causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()
    prompt_bias = torch.zeros(first.numel(), 1, p, p, device=device)
    prompt_bias.masked_fill_(~(causal[None, None] & p_real[first][:, None, None, :]), torch.finfo(torch.float32).min)
    groups: list[_LengthGroup] = []
    unpack = rows.new_zeros(0)
    if rows.numel():
        packed_at = torch.zeros(live.shape, dtype=torch.long, device=device)
        packed_at[rows, cols] = torch.arange(rows.numel(), device=device)
        lengths = prompt_mask.sum(-1)
        for n in torch.unique(lengths).tolist():
            idx = (lengths == n).nonzero().squeeze(-1)
            allowed = None
            if t - 1 <= MASKED_UP_TO:
                allowed = torch.ones(t - 1, int(n) + t - 1, dtype=torch.bool, device=device).tril(int(n))
            gather, within = packed_at[idx], live[idx]
            groups.append(_LengthGroup(int(n), idx, gather, within, gather[within], allowed))
        slot = torch.empty_like(response_lengths)  # each row's place in the concatenated groups
        slot[torch.cat([g.idx for g in groups])] = torch.arange(response_lengths.numel(), device=device)
        unpack = slot[rows] * (t - 1) + cols
    return _Layout(rows, cols, prompt_bias, groups, unpack)


def _response_attention(
    att: _Attention,
    qr: torch.Tensor,  # (N, heads, d): the packed response inputs' queries
    kp: torch.Tensor,  # (u, kv, P, d): the distinct prompts' keys, left-padded
    vp: torch.Tensor,
    kr: torch.Tensor,  # (N, kv, d): the packed response inputs' keys
    vr: torch.Tensor,
    inverse: torch.Tensor,  # (B,): each row's distinct prompt
    lay: _Layout,
) -> torch.Tensor:
    """Each row's response queries over [its prompt's real keys, its own response keys so far]:
    per prompt length n, one pass over the rows' keys ``[real prompt, response]``, masked or
    causal (see :class:`_LengthGroup`); padding past a row's end comes after its real keys, so
    neither lets a real query see it. Returns (N, heads, d)."""
    p, parts = kp.shape[2], []
    for g in lay.groups:
        q, k, v = (
            _Gather.apply(x, g.gather, g.live, g.targets).transpose(1, 2) for x in (qr, kr, vr)
        )  # (g, heads|kv, T-1, d)
        # a prompt's rows share its keys: index_select's gradient adds them up one row after another
        # (an indexing's would add them from several threads at once, in no fixed order)
        shared = inverse[g.idx]
        keys = _expand_kv(torch.cat([kp.index_select(0, shared)[:, :, p - g.n :], k], 2), att.heads)
        vals = _expand_kv(torch.cat([vp.index_select(0, shared)[:, :, p - g.n :], v], 2), att.heads)
        if g.allowed is not None:
            out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=g.allowed)
        else:
            q = torch.cat([q.new_zeros(q.shape[0], q.shape[1], g.n, q.shape[3]), q], 2)
            out = F.scaled_dot_product_attention(q, keys, vals, is_causal=True)[:, :, g.n :]
        parts.append(out.transpose(1, 2))  # (g, T-1, heads, d)
    return torch.cat(parts).flatten(0, 1)[lay.unpack]


class _Gather(torch.autograd.Function):
    """``x[index]`` whose gradient is a plain scatter of the ``live`` entries (into ``targets``).
    Autograd's accumulating scatter would add into the one input that the entries past a row's end
    all point at, in parallel and in no fixed order; those entries' gradient is zero (their outputs
    are dropped) and every other input appears once among the live ones, so the plain scatter is
    exact and deterministic."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, live: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(live, targets)
        ctx.rows = x.shape[0]
        return x[index]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        live, targets = ctx.saved_tensors  # targets = index[live], computed once per layout
        out = grad.new_zeros(ctx.rows, *grad.shape[live.dim() :])
        out[targets] = grad[live]
        return out, None, None, None


class _Attention:
    """One layer's attention mathematics on the model's own parameters (differentiable)."""

    def __init__(self, model: PreTrainedModel, layer: torch.nn.Module) -> None:
        cfg, at = model.config, layer.self_attn
        self.heads = cfg.num_attention_heads
        self.kv = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.ln = layer.input_layernorm
        self.w = torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])
        self.bias = None if at.q_proj.bias is None else torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
        self.q_norm, self.k_norm = getattr(at, "q_norm", None), getattr(at, "k_norm", None)
        self.o = at.o_proj

    def project(self, x: torch.Tensor, cos: torch.Tensor, signed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v (..., heads|kv, d) of ``x`` (..., H), rotated at the positions of ``cos`` and
        :func:`~creditrl.policy.engines.decoder.signed_sin` (..., 1, d)."""
        qkv = F.linear(_rms(x, self.ln), self.w, self.bias)
        # split, not three slices: its gradient is one concatenation, the slices' three zero-filled adds
        q, k, v = qkv.split([self.heads * self.d, self.kv * self.d, self.kv * self.d], -1)
        q = q.unflatten(-1, (self.heads, self.d))
        k, v = (x.unflatten(-1, (self.kv, self.d)) for x in (k, v))
        if self.q_norm is not None:
            q = _rms(q, self.q_norm)
        if self.k_norm is not None:
            k = _rms(k, self.k_norm)
        return rotary(q, cos, signed), rotary(k, cos, signed), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + bias) v over (b, heads|kv, s, d) tensors -> (b, heads, s, d)."""
        return F.scaled_dot_product_attention(q, _expand_kv(k, self.heads), _expand_kv(v, self.heads), attn_mask=bias)

    def out(self, a: torch.Tensor) -> torch.Tensor:
        return F.linear(a.flatten(-2), self.o.weight, self.o.bias)


def packed_response_logits(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,  # (B, P) left-padded
    prompt_mask: torch.Tensor,  # (B, P)
    response_ids: torch.Tensor,  # (B, T) right-padded
    response_lengths: torch.Tensor,  # (B,)
    first: torch.Tensor,  # (u,) one row per distinct prompt
    inverse: torch.Tensor,  # (B,) each row's distinct prompt
) -> torch.Tensor:
    """Logits (B, T, V) predicting each response token (0 at padding positions), float32."""
    base = model.model
    b, t = response_ids.shape
    lay = _layout(prompt_mask, response_lengths, first, t)
    rows, cols = lay.rows, lay.cols
    # the embedding's padding_idx as in nn.Embedding: a sampled pad token gets no embedding gradient
    embed = base.embed_tokens
    hp = F.embedding(prompt_ids[first], embed.weight, embed.padding_idx)  # (u, P, H): each distinct prompt once
    hr = F.embedding(response_ids[rows, cols], embed.weight, embed.padding_idx)  # (N, H): the packed response inputs
    p_pos = (prompt_mask[first].cumsum(-1) - 1).clamp(min=0)  # as positions_from_mask
    cos_p, sin_p = (x[:, :, None] for x in base.rotary_emb(hp, p_pos))  # (u, P, 1, d)
    cos_r, sin_r = (x[0, :, None] for x in base.rotary_emb(hr[None], (prompt_mask.sum(-1)[rows] + cols)[None]))
    sin_p, sin_r = signed_sin(sin_p), signed_sin(sin_r)
    for layer in base.layers:
        att = _Attention(model, layer)
        q, k, v = (x.transpose(1, 2) for x in att.project(hp, cos_p, sin_p))  # (u, heads|kv, P, d)
        hp = hp + att.out(att.attend(q, k, v, lay.prompt_bias).transpose(1, 2))
        hp = hp + _mlp(layer.mlp, _rms(hp, layer.post_attention_layernorm))
        if not lay.groups:
            continue
        qr, kr, vr = att.project(hr, cos_r, sin_r)  # (N, heads|kv, d)
        hr = hr + att.out(_response_attention(att, qr, k, v, kr, vr, inverse, lay))
        hr = hr + _mlp(layer.mlp, _rms(hr, layer.post_attention_layernorm))
    head = model.get_output_embeddings()
    logits = hp.new_zeros(b, t, head.weight.shape[0])
    first_logits = F.linear(_rms(hp[:, -1], base.norm), head.weight, head.bias)
    logits[:, 0] = first_logits.index_select(0, inverse)  # the prompt emits token 0 (a deterministic gradient)
    if rows.numel():
        logits = logits.index_put((rows, cols + 1), F.linear(_rms(hr, base.norm), head.weight, head.bias))
    return logits.float()


def _mlp(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The gated MLP with ``gate|up`` as one product (a concatenation of the weights: differentiable)."""
    w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    bias = None if mlp.gate_proj.bias is None else torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
    gate, up = F.linear(x, w, bias).chunk(2, dim=-1)
    return F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
