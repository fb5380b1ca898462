"""The trajectory batch: one RL iteration's samples laid out as (B, T) tensors.

Layout: prompts left-padded to width P, responses right-padded to width T, so
``cat(prompt_ids, response_ids)`` is one (B, P + T) sequence whose logits at
``[:, P-1 : P+T-1]`` predict the response tokens. All credit tensors are (B, T) over the
response part (see DESIGN.md, "The currency").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from creditrl.policy.engine import Generation, left_pad, positions_from_mask


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

    def select(self, rows: torch.Tensor) -> "TrajectoryBatch":
        """The sub-batch of the given row indices (per-response extras follow the rows)."""
        idx = rows.tolist()
        return TrajectoryBatch(
            prompt_ids=self.prompt_ids[rows],
            prompt_mask=self.prompt_mask[rows],
            response_ids=self.response_ids[rows],
            response_lengths=self.response_lengths[rows],
            response_mask=self.response_mask[rows],
            old_logprobs=self.old_logprobs[rows],
            group_ids=self.group_ids[rows],
            finished=self.finished[rows],
            extras={k: [v[i] for i in idx] for k, v in self.extras.items()},
        )


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
    valid = (torch.arange(width)[None, :] < batch.response_lengths[:, None]).long()
    ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (B, P+T)
    attn = torch.cat([batch.prompt_mask, valid], dim=1)
    return ids, attn, positions_from_mask(attn)


def _response_slice(x: torch.Tensor, batch: TrajectoryBatch) -> torch.Tensor:
    """Positions ``P-1 .. P+T-2`` of a (B, P + T, ...) output: the states that emit each response token."""
    p, width = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    return x[:, p - 1 : p - 1 + width]


def response_logits(model: PreTrainedModel, batch: TrajectoryBatch) -> torch.Tensor:
    """Logits (B, T, V) that predict each response token, from one forward pass."""
    return response_forward(model, batch)[0]


def response_forward(
    model: PreTrainedModel, batch: TrajectoryBatch, *, hidden: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (B, T, V) predicting each response token and, with ``hidden``, the last hidden
    state (B, T, H) at the same positions: the state *before* each token is emitted, which is
    what a value head reads (V(s_t) in DESIGN.md)."""
    ids, attn, pos = _joined(batch)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=hidden)
    states = _response_slice(out.hidden_states[-1], batch) if hidden else None
    return _response_slice(out.logits, batch).float(), states


def response_states(backbone: torch.nn.Module, batch: TrajectoryBatch) -> torch.Tensor:
    """Last hidden states (B, T, H) of a base model (no LM head) before each response token."""
    ids, attn, pos = _joined(batch)
    return _response_slice(backbone(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state, batch)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] for (B, T, V) logits and (B, T) tokens -> (B, T)."""
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the policy at each position, (B, T, V) -> (B, T)."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
