"""The trajectory batch: one RL iteration's samples laid out as (B, T) tensors.

Layout: prompts left-padded to width P, responses right-padded to width T, so
``cat(prompt_ids, response_ids)`` is one (B, P + T) sequence whose logits at
``[:, P-1 : P+T-1]`` predict the response tokens. All credit tensors are (B, T) over the
response part (see docs/design.md, "The currency").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from creditrl.policy.device import is_fsdp, module_device
from creditrl.policy.engines import Generation, left_pad, positions_from_mask
from creditrl.rollout.packed import packed_reason, packed_response_logits


@dataclass
class TrajectoryBatch:
    prompt_ids: torch.Tensor  # long (B, P), left-padded
    prompt_mask: torch.Tensor  # long (B, P), 1 on real prompt tokens
    response_ids: torch.Tensor  # long (B, T), right-padded
    response_lengths: torch.Tensor  # long (B,), number of generated tokens
    response_mask: torch.Tensor  # bool (B, T), tokens trained on
    old_logprobs: torch.Tensor  # float (B, T), log pi_old(token); 0 on padding
    group_ids: torch.Tensor  # long (B,), responses to one prompt share an id
    finished: torch.Tensor  # bool (B,), ended with eos
    extras: dict[str, Any] = field(default_factory=dict)  # per-response objects (problems, texts)

    @property
    def size(self) -> int:
        return int(self.response_ids.shape[0])

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor], **changes: Any) -> TrajectoryBatch:
        """The batch with ``fn`` applied to every tensor field, and ``changes``."""
        return replace(
            self, **{f.name: fn(getattr(self, f.name)) for f in fields(self) if f.name != "extras"}, **changes
        )

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        """The batch with every tensor on ``device`` (this batch itself when already there);
        ``extras`` are shared, not copied."""
        device = torch.device(device)
        return self if self.response_ids.device == device else self._map(lambda x: x.to(device))

    def select(self, rows: torch.Tensor) -> TrajectoryBatch:
        """The sub-batch of the given row indices (per-response extras follow the rows)."""
        idx = rows.tolist()
        return self._map(lambda x: x[rows], extras={k: [v[i] for i in idx] for k, v in self.extras.items()})

    def trimmed(self) -> TrajectoryBatch:
        """The same rows without all-padding columns: prompt columns on the left, response
        columns past the longest response (per-token tensors of the caller are cut with
        ``[:, :trimmed.response_ids.shape[1]]``)."""
        real = self.prompt_mask.bool().any(0).nonzero()
        start = int(real.min()) if real.numel() else self.prompt_ids.shape[1] - 1
        width = max(1, int(self.response_lengths.max()))
        return replace(
            self,
            prompt_ids=self.prompt_ids[:, start:],
            prompt_mask=self.prompt_mask[:, start:],
            response_ids=self.response_ids[:, :width],
            response_mask=self.response_mask[:, :width],
            old_logprobs=self.old_logprobs[:, :width],
        )


def micro_batches(batch: TrajectoryBatch, rows: torch.Tensor, max_positions: int) -> list[torch.Tensor]:
    """Split ``rows`` into micro-batches of at most ``max_positions`` padded positions (or one
    row): whole prompt groups where they fit (so a group's shared prompt is computed once), a
    group wider than the budget in parts of its rows. Units are ordered by length so each
    micro-batch pads to little more than its own longest row. ``max_positions <= 0`` keeps
    ``rows`` whole."""
    if max_positions <= 0:
        return [rows]
    prompt_len = batch.prompt_mask[rows].sum(-1)
    response_len = batch.response_lengths[rows]
    total = prompt_len + response_len

    def width(idx: list[int]) -> int:
        return int(prompt_len[idx].max()) + int(response_len[idx].max())

    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids[rows].tolist()):
        groups.setdefault(g, []).append(i)
    units: list[list[int]] = []
    for idx in groups.values():
        if len(idx) * width(idx) <= max_positions:
            units.append(idx)
            continue
        part: list[int] = []
        for i in sorted(idx, key=lambda j: int(total[j])):
            if part and (len(part) + 1) * width(part + [i]) > max_positions:
                units.append(part)
                part = []
            part.append(i)
        units.append(part)
    out: list[list[int]] = []
    current: list[int] = []
    for idx in sorted(units, key=lambda u: int(total[u].max())):
        candidate = current + idx
        if current and len(candidate) * width(candidate) > max_positions:
            out.append(current)
            candidate = idx
        current = candidate
    out.append(current)
    return [rows[torch.tensor(c)] for c in out]


def chunked_response_logprobs(
    model: PreTrainedModel, batch: TrajectoryBatch, max_positions: int, *, packed: bool = True
) -> torch.Tensor:
    """:func:`response_logprobs` of every row, computed over :func:`micro_batches` of at most
    ``max_positions`` padded positions (a no-gradient pass then holds one chunk's activations);
    float (B, T) on ``batch``'s device, 0 at padding."""
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
    for rows in micro_batches(batch, torch.arange(batch.size), max_positions):
        part = batch.select(rows).trimmed()
        out[rows, : part.response_ids.shape[1]] = response_logprobs(model, part, packed=packed).to(out.device)
    return torch.where(batch.response_mask.to(out.device), out, 0)


def batch_from_generation(gen: Generation, group_ids: list[int], pad_id: int) -> TrajectoryBatch:
    """Pack a :class:`Generation` into tensors; ``group_ids[i]`` is sample i's group."""
    n = len(gen.tokens)
    if len(group_ids) != n:
        raise ValueError(f"group_ids has {len(group_ids)} entries for {n} samples")
    prompt_ids, prompt_mask = left_pad(gen.prompt_ids, pad_id)
    width = max(1, max(len(t) for t in gen.tokens))
    response_ids = torch.full((n, width), pad_id, dtype=torch.long)
    old_logprobs = torch.zeros((n, width), dtype=torch.float32)
    lengths = torch.tensor([len(t) for t in gen.tokens], dtype=torch.long)
    for i, (toks, lps) in enumerate(zip(gen.tokens, gen.logprobs)):
        response_ids[i, : len(toks)] = torch.as_tensor(toks, dtype=torch.long)
        old_logprobs[i, : len(lps)] = torch.as_tensor(lps, dtype=torch.float32)
    response_mask = torch.arange(width)[None, :] < lengths[:, None]
    return TrajectoryBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_lengths=lengths,
        response_mask=response_mask,
        old_logprobs=old_logprobs,
        group_ids=torch.as_tensor(group_ids, dtype=torch.long),
        finished=torch.as_tensor(gen.finished, dtype=torch.bool),
    )


def _joined(batch: TrajectoryBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask, position_ids)`` of prompt + response, each (B, P + T)."""
    width = batch.response_ids.shape[1]
    valid = (
        torch.arange(width, device=batch.response_lengths.device)[None, :] < batch.response_lengths[:, None]
    ).long()
    ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (B, P+T)
    attn = torch.cat([batch.prompt_mask, valid], dim=1)
    return ids, attn, positions_from_mask(attn)


def _response_slice(x: torch.Tensor, batch: TrajectoryBatch) -> torch.Tensor:
    """Positions ``P-1 .. P+T-2`` of a (B, P + T, ...) output: the states that emit each response token."""
    p, width = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    return x[:, p - 1 : p - 1 + width]


def response_logits(model: PreTrainedModel, batch: TrajectoryBatch, *, packed: bool = True) -> torch.Tensor:
    """Logits (B, T, V) that predict each response token, from one forward pass (on the model's
    device); ``packed`` as in :func:`response_forward`."""
    return response_forward(model, batch, packed=packed)[0]


def response_logprobs(model: PreTrainedModel, batch: TrajectoryBatch, *, packed: bool = True) -> torch.Tensor:
    """log pi(token) of every response position under ``model``, float (B, T) on ``batch``'s
    device (padding positions hold the log-prob of the pad token, or of 0 logits in the packed
    pass; mask them)."""
    logits = response_logits(model, batch, packed=packed)
    return token_logprobs(logits, batch.response_ids.to(logits.device)).to(batch.response_ids.device)


def response_forward(
    model: PreTrainedModel, batch: TrajectoryBatch, *, hidden: bool = False, packed: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (B, T, V) predicting each response token and, with ``hidden``, the last hidden
    state (B, T, H) at the same positions: the state *before* each token is emitted, which is
    what a value head reads (V(s_t) in docs/design.md). Both are on the model's device.

    With ``packed`` (``policy.forward=auto``), where :func:`~creditrl.rollout.packed.packed_reason`
    allows (a plain float32 Llama-family model, no hidden states), the packed pass of
    :mod:`creditrl.rollout.packed` runs. Otherwise rows that share a prompt share its computation
    (:func:`_shared_prompt_forward`), or one plain pass runs (:func:`_plain_response_forward`)."""
    batch = batch.to(module_device(model))
    if packed and not hidden and packed_reason(model, batch.prompt_ids.shape[1] + batch.response_ids.shape[1]) is None:
        first, inverse = _distinct_prompts(batch)
        args = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_lengths, first, inverse)
        return packed_response_logits(model, *args), None
    groups = _prompt_groups(batch, model)
    if groups is not None:
        logits, states = _shared_prompt_forward(model, batch, groups, lm=True, hidden=hidden)
        return logits.float(), states
    return _plain_response_forward(model, batch, hidden=hidden)


def response_states(backbone: torch.nn.Module, batch: TrajectoryBatch) -> torch.Tensor:
    """Last hidden states (B, T, H) of a base model (no LM head) before each response token, on
    the model's device."""
    batch = batch.to(module_device(backbone))
    groups = _prompt_groups(batch, backbone)
    if groups is not None:
        return _shared_prompt_forward(backbone, batch, groups, lm=False, hidden=True)[1]
    return _plain_response_states(backbone, batch)


def _plain_response_forward(
    model: PreTrainedModel, batch: TrajectoryBatch, *, hidden: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_forward` as one pass over every row's ``cat(prompt, response)``."""
    ids, attn, pos = _joined(batch)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=hidden)
    states = _response_slice(out.hidden_states[-1], batch) if hidden else None
    return _response_slice(out.logits, batch).float(), states


def _plain_response_states(backbone: torch.nn.Module, batch: TrajectoryBatch) -> torch.Tensor:
    """:func:`response_states` as one pass over every row's ``cat(prompt, response)``."""
    ids, attn, pos = _joined(batch)
    return _response_slice(backbone(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state, batch)


# Rows per distinct prompt below which the plain pass is used: the shared forward saves
# (B - u) prompt passes but costs a second model call.
_MIN_SHARE = 2.0


def _distinct_prompts(batch: TrajectoryBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)``: ``first`` (u,) one row index per distinct prompt (identical
    ``prompt_ids`` and ``prompt_mask`` rows), ``inverse`` (B,) each row's distinct prompt."""
    b = batch.size
    key = torch.cat([batch.prompt_ids, batch.prompt_mask], dim=1)  # (B, 2P)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)  # (B,)
    u = int(inverse.max()) + 1
    rows = torch.arange(b, device=inverse.device)
    first = torch.full((u,), b, dtype=torch.long, device=inverse.device).scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def _prompt_groups(batch: TrajectoryBatch, module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`_distinct_prompts` when the shared-prompt forward is used; ``None`` for the plain
    pass: too few repeated prompts for the second pass to pay, or a model that cannot run the
    prompt through a plain, differentiable ``DynamicCache`` (activation checkpointing drops the
    cache; sliding-window or non-attention layers keep other state). An FSDP2 module always takes
    the plain pass: it all-gathers in every model call, so its ranks must make the same calls,
    and whether a micro-batch shares its prompts depends on that rank's rows."""
    if batch.size < 2 or is_fsdp(module):
        return None
    first, inverse = _distinct_prompts(batch)
    if batch.size < _MIN_SHARE * first.numel():
        return None
    if (
        torch.is_grad_enabled()
        and module.training
        and any(getattr(m, "gradient_checkpointing", False) for m in module.modules())
    ):
        return None
    if not all(type(layer) is DynamicLayer for layer in DynamicCache(config=module.config).layers):
        return None
    return first, inverse


def _shared_prompt_forward(
    module: torch.nn.Module,
    batch: TrajectoryBatch,
    groups: tuple[torch.Tensor, torch.Tensor],
    *,
    lm: bool,
    hidden: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The plain pass's outputs at the response positions, computing each distinct prompt once.

    1. the u distinct prompts (u, P) run once with a ``DynamicCache``; their last position emits
       response token 0, and the cache holds their keys/values (u, kv_heads, P, head_dim);
    2. the cache is expanded to the B rows (an index, so gradients from every row flow back to
       the shared prompt computation);
    3. ``response_ids[:, :T-1]`` (the last token emits nothing) run on that cache, with the
       attention mask ``cat(prompt_mask, response validity)`` and the positions continuing each
       row's prompt, as in the plain pass.

    Same mathematics as :func:`_plain_response_forward` (the prompt part never attends to the
    response). ``lm``: ``module`` is a causal LM (returns raw logits (B, T, V) and, with
    ``hidden``, ``hidden_states[-1]`` (B, T, H)); else a base model (returns ``(None,
    last_hidden_state)``).
    """
    first, inverse = groups
    p = batch.prompt_ids.shape[1]
    width = batch.response_ids.shape[1]
    p_mask = batch.prompt_mask[first]
    cache = DynamicCache(config=module.config)
    extra: dict[str, Any] = {"logits_to_keep": 1, "output_hidden_states": hidden} if lm else {}
    out = module(
        input_ids=batch.prompt_ids[first],
        attention_mask=p_mask,
        position_ids=positions_from_mask(p_mask),
        cache=cache,
        use_cache=True,
        **extra,
    )
    if out.cache is not cache:
        raise RuntimeError("shared-prompt forward: the model did not fill the prompt cache")
    logits = out.logits[:, -1:][inverse] if lm else None  # (B, 1, V)
    states = None
    if hidden:
        states = (out.hidden_states[-1] if lm else out.last_hidden_state)[:, -1:][inverse]  # (B, 1, H)
    if width == 1:
        return logits, states
    cache.batch_select_indices(inverse)  # (u, ...) -> (B, ...) per layer, differentiable
    steps = torch.arange(width - 1, device=batch.response_lengths.device)
    valid = (steps[None, :] < batch.response_lengths[:, None]).long()
    attn = torch.cat([batch.prompt_mask, valid], dim=1)  # (B, P + T - 1)
    extra = {"output_hidden_states": hidden} if lm else {}
    out = module(
        input_ids=batch.response_ids[:, : width - 1],
        attention_mask=attn,
        position_ids=positions_from_mask(attn)[:, p:],
        cache=cache,
        use_cache=True,
        **extra,
    )
    if lm:
        logits = torch.cat([logits, out.logits], dim=1)  # (B, T, V)
    if hidden:
        states = torch.cat([states, out.hidden_states[-1] if lm else out.last_hidden_state], dim=1)  # (B, T, H)
    return logits, states


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] for (B, T, V) logits and (B, T) tokens -> (B, T)."""
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the policy at each position, (B, T, V) -> (B, T)."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
