"""Learned value functions: a critic (one value head) and a dual critic (two, ``V = min(V1, V2)``).

A critic maps the hidden state *before* response token t to V(s_t) (docs/design.md, "The
currency"). Two placements of the heads:

- ``separate``: a copy of the initial policy's backbone (no LM head) plus scalar heads, with
  its own optimizer -- the classic PPO critic (Ouyang et al. 2022 initialise it from a model
  of the policy's family);
- ``shared``: scalar heads on the policy's own last hidden state; the value loss is added to
  the policy loss with weight ``value.coef`` and its gradient reaches the shared trunk.

The dual critic (``members=2``) trains two heads (two backbones when separate) from different
head initialisations on the same returns and reports ``V = min(V1, V2)`` per token: the
clipped double-Q idea (Fujimoto et al. 2018, arXiv:1802.09477) applied to V, against the
over-estimation a single fitted critic drifts into. Each member is trained with the PPO
clipped value loss (:func:`creditrl.losses.clipped_value_loss`) toward the estimator's
``returns``.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from creditrl.rollout.batch import TrajectoryBatch, response_states


class Critic(nn.Module):
    """``members`` scalar value heads, on a backbone of their own or on the policy's states.

    ``member_values(batch, policy_states)`` returns (M, B, T) and :meth:`combine` takes their
    per-token minimum. A ``shared`` critic reads the policy's last hidden states (B, T, H)
    (:func:`creditrl.rollout.batch.response_forward`).
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        members: int = 1,
        backbones: list[nn.Module] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if members < 1:
            raise ValueError(f"a critic needs at least one member, got {members}")
        if backbones is not None and len(backbones) != members:
            raise ValueError(f"{members} members need {members} backbones, got {len(backbones)}")
        self.members = members
        self.backbones = nn.ModuleList(backbones) if backbones is not None else None
        self.heads = nn.ModuleList(nn.Linear(hidden_size, 1) for _ in range(members))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for head in self.heads:
                # small random heads: members must differ, or a dual critic is one critic twice
                head.weight.copy_(torch.randn(head.weight.shape, generator=gen) / (10 * math.sqrt(hidden_size)))
                head.bias.zero_()

    @property
    def shared(self) -> bool:
        return self.backbones is None

    def member_values(self, batch: TrajectoryBatch, policy_states: Tensor | None = None) -> Tensor:
        """Each member's V(s_t) over the response positions, (M, B, T), 0 past each length."""
        outs = []
        for i, head in enumerate(self.heads):
            if self.backbones is None:
                if policy_states is None:
                    raise ValueError("a shared critic reads the policy's hidden states; pass policy_states (B, T, H)")
                states = policy_states
            else:
                states = response_states(self.backbones[i], batch)  # (B, T, H)
            outs.append(head(states.float()).float().squeeze(-1))  # (B, T), float32 also under autocast
        values = torch.stack(outs)  # (M, B, T), on the critic's device
        return values * batch.response_mask[None].to(values)

    def forward(self, batch: TrajectoryBatch, policy_states: Tensor | None = None) -> Tensor:
        """:meth:`member_values`, so that a DDP wrapper's forward (which prepares its gradient
        all-reduce) runs it."""
        return self.member_values(batch, policy_states)

    @staticmethod
    def combine(member_values: Tensor) -> Tensor:
        """Per-token minimum over members: (M, B, T) -> (B, T)."""
        return member_values.min(dim=0).values


def build_critic(
    policy: PreTrainedModel, *, members: int, placement: str, seed: int = 0, backbone: str = "policy"
) -> Critic:
    """A critic for ``policy``: ``placement="shared"`` (``value.model``) puts the heads on the
    policy itself; ``separate`` gives every member its own backbone: a copy of the policy's
    (``backbone="policy"``) or the base model of ``backbone`` (``"tiny"`` or a local causal-LM
    path), which must read the policy's token ids (same vocabulary size)."""
    if placement == "shared":
        return Critic(int(policy.config.hidden_size), members=members, seed=seed)
    source = policy
    if backbone not in ("", "policy"):
        from creditrl.policy.model import load_policy

        source, _ = load_policy(backbone, seed=seed)
        if source.config.vocab_size != policy.config.vocab_size:
            raise ValueError(
                f"value.backbone: '{backbone}' has a vocabulary of {source.config.vocab_size} tokens, the policy "
                f"{policy.config.vocab_size}; a separate critic must read the policy's token ids"
            )
    backbones = [copy.deepcopy(source.base_model) for _ in range(members)]
    for b in backbones:
        b.requires_grad_(True)
    return Critic(int(source.config.hidden_size), members=members, backbones=backbones, seed=seed)
