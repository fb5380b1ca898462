"""The process reward model: a causal-LM backbone with a scalar head read at step-end tokens.

One example is encoded as ``bos + prompt + step_1 + step_2 + ...`` (step texts concatenated
verbatim, so a step carries its own separator, e.g. ``"3*2=6;"``). The score of step k is

    p_k = sigmoid(w . h(last token of step k) + b)

where ``h`` is the backbone's last hidden state. Causal attention makes ``p_k`` a function of
the prompt and steps 1..k only, as a step reward must be (Lightman et al. 2023, "Let's Verify
Step by Step", arXiv:2305.20050; Wang et al. 2023, Math-Shepherd, arXiv:2312.08935).

Likelihood features (``likelihood=True``): the head also reads two numbers per step, the sum
and the minimum over the step's tokens of each token's log-probability under a frozen copy of
the policy the PRM was built from (the reference; not trained, so the signal cannot be
overfitted away):

    p_k = sigmoid(w . h(end_k) + u . [sum_{t in step k} log p(x_t | x_<t), min_{t in step k} log p(x_t | x_<t)] + b)

A policy that writes canonical steps puts low probability on a wrong one, so its likelihood is
a strong verifier on its own; the trained head decides how to combine it with the hidden state.
``u`` starts at 0.

Ensembles: ``members = K`` members, combined per step by ``mean`` or ``min`` of the members'
probabilities (``min`` is the pessimistic reading, as for the dual critic in
:mod:`creditrl.values.critic`). By default each member is a full backbone + head, since the
tiny backbone is cheap and members that share nothing disagree more; ``share_backbone=True``
puts K heads on one backbone. Members differ by head initialisation (seed ``seed``, member i)
and, in :func:`creditrl.prm.train.train_prm`, by the order they see the data in.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from creditrl.policy.device import module_device
from creditrl.policy.model import load_policy
from creditrl.policy.tokenizer import encode_prompt

CONFIG_FILE = "prm_config.json"
HEADS_FILE = "heads.pt"
LIKELIHOOD_FILE = "likelihood.pt"
FORMAT_VERSION = 1


COMBINES: dict[str, Callable[[Tensor], Tensor]] = {
    "mean": lambda probs: probs.mean(dim=0),
    "min": lambda probs: probs.min(dim=0).values,
}
"""Member combiners: member probabilities (M, ...) -> combined probabilities (...)."""


def encode(
    tokenizer: PreTrainedTokenizerBase, prompt: str, steps: Sequence[str], *, max_len: int
) -> tuple[list[int], list[int]]:
    """Token ids of ``bos + prompt + steps`` and the index of each step's last token.

    Steps are appended whole, in order, while the sequence stays within ``max_len`` tokens;
    the first step that does not fit and every step after it are dropped (a step cannot be
    judged without the steps before it, and the prompt is never cut). So the returned
    positions may be fewer than ``steps``: position ``k`` belongs to ``steps[k]``.

    Raises:
        ValueError: if a step is empty (it has no token to read a score at) or if bos +
            prompt alone exceed ``max_len``.
    """
    ids = encode_prompt(tokenizer, prompt)
    if len(ids) > max_len:
        raise ValueError(f"the prompt takes {len(ids)} tokens with bos, more than max_len={max_len}")
    ends: list[int] = []
    for k, step in enumerate(steps):
        step_ids = tokenizer(step, add_special_tokens=False)["input_ids"]
        if not step_ids:
            raise ValueError(f"step {k} of prompt {prompt!r} is empty: a step needs a token to be scored at")
        if len(ids) + len(step_ids) > max_len:
            break
        ids.extend(step_ids)
        ends.append(len(ids) - 1)
    return ids, ends


def step_positions(ends: Sequence[int], start: int, width: int) -> list[int]:
    """Per position of a row of ``width`` tokens: the step it belongs to, or -1 (prompt, padding).

    Step k covers positions ``ends[k-1] + 1 .. ends[k]``, step 0 starts at ``start`` (the first
    token after bos + prompt)."""
    out = [-1] * width
    first = start
    for k, end in enumerate(ends):
        for t in range(first, end + 1):
            out[t] = k
        first = end + 1
    return out


def right_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded ``(input_ids, attention_mask)``, each long (B, L)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


class ProcessRewardModel(nn.Module):
    """``members`` scalar heads over causal-LM backbones (no LM head), read at step ends.

    Args:
        backbones: the base models (``AutoModel``-style: ``last_hidden_state`` out), one per
            member, or a single one shared by all heads.
        members: number of ensemble members M.
        combine: ``"mean"`` or ``"min"`` over the members' probabilities.
        seed: head initialisation seed; member i's head is drawn from ``(seed, i)``.
    """

    def __init__(
        self,
        backbones: Sequence[nn.Module],
        *,
        members: int = 1,
        combine: str = "mean",
        seed: int = 0,
        reference: PreTrainedModel | None = None,
    ) -> None:
        super().__init__()
        if members < 1:
            raise ValueError(f"a PRM needs at least one member, got members={members}")
        if len(backbones) not in (1, members):
            raise ValueError(f"{members} members need 1 (shared) or {members} backbones, got {len(backbones)}")
        self.members = members
        self.combine = combine  # validated by the setter below
        self.backbones = nn.ModuleList(backbones)
        hidden = int(backbones[0].config.hidden_size)
        self.heads = nn.ModuleList(nn.Linear(hidden, 1) for _ in range(members))
        with torch.no_grad():
            for i, head in enumerate(self.heads):
                # small random heads, a different draw per member: identical members are one member
                gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
                head.weight.copy_(torch.randn(head.weight.shape, generator=gen) / (10 * math.sqrt(hidden)))
                head.bias.zero_()
        # likelihood features: a frozen reference LM and a (2 -> 1) weight per member, from 0
        self.reference = reference.eval().requires_grad_(False) if reference is not None else None
        self.feature_heads = nn.ModuleList(nn.Linear(2, 1, bias=False) for _ in range(members)) if reference else None
        for f in self.feature_heads or ():
            nn.init.zeros_(f.weight)

    @property
    def likelihood(self) -> bool:
        return self.reference is not None

    @torch.no_grad()
    def token_logprobs(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """log p_ref(x_t | x_<t) under the frozen reference, (B, L); 0 at position 0."""
        self.reference.eval()
        logits = self.reference(input_ids=input_ids, attention_mask=attention_mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return torch.nn.functional.pad(logp, (1, 0))

    @property
    def combine(self) -> str:
        return self._combine

    @combine.setter
    def combine(self, value: str) -> None:
        if value not in COMBINES:
            raise ValueError(f"combine: unknown value {value!r}; valid: {', '.join(COMBINES)}")
        self._combine = value

    @property
    def share_backbone(self) -> bool:
        return len(self.backbones) == 1 and self.members > 1

    @property
    def max_positions(self) -> int:
        """Longest sequence the backbone was configured for (the default ``max_len``)."""
        return int(self.backbones[0].config.max_position_embeddings)

    def backbone_of(self, member: int) -> nn.Module:
        return self.backbones[member if len(self.backbones) > 1 else 0]

    @classmethod
    def from_model(
        cls,
        policy: PreTrainedModel,
        *,
        members: int = 1,
        combine: str = "mean",
        seed: int = 0,
        share_backbone: bool = False,
        likelihood: bool = False,
    ) -> ProcessRewardModel:
        """A PRM whose backbones are copies of ``policy``'s base model (its LM head is dropped);
        with ``likelihood``, a frozen copy of the whole policy is the reference LM."""
        n = 1 if share_backbone else members
        backbones = [copy.deepcopy(policy.base_model) for _ in range(n)]
        for b in backbones:
            b.requires_grad_(True)
        reference = copy.deepcopy(policy) if likelihood else None
        return cls(backbones, members=members, combine=combine, seed=seed, reference=reference)

    @classmethod
    def from_policy(cls, path_or_tiny: str, *, seed: int = 0, **options: Any) -> ProcessRewardModel:
        """A PRM initialised from a policy checkpoint (a local causal-LM folder such as the SFT
        policy) or ``"tiny"`` (built with init seed ``seed``); ``options`` are those of
        :meth:`from_model`. Its tokenizer is the policy's (``load_policy(path_or_tiny)[1]``)."""
        policy, _ = load_policy(path_or_tiny, seed=seed)
        return cls.from_model(policy, seed=seed, **options)

    def _head(self, member: int, states: Tensor, token_lp: Tensor | None, step_index: Tensor | None) -> Tensor:
        """Member ``member``'s logit at every position from backbone states (B, L, H) -> (B, L)."""
        logit = self.heads[member](states.float()).squeeze(-1)  # (B, L)
        if token_lp is None:  # no likelihood features
            return logit
        valid = step_index >= 0
        slot = torch.where(valid, step_index, 0)  # (B, L)
        k = int(step_index.max()) + 1 if bool(valid.any()) else 1
        sums = token_lp.new_zeros(token_lp.shape[0], k).scatter_add(1, slot, torch.where(valid, token_lp, 0.0))
        mins = token_lp.new_zeros(token_lp.shape[0], k).scatter_reduce(
            1, slot, torch.where(valid, token_lp, 0.0), reduce="amin", include_self=True
        )
        feats = torch.stack([sums.gather(1, slot), mins.gather(1, slot)], dim=-1)  # (B, L, 2)
        return logit + torch.where(valid, self.feature_heads[member](feats).squeeze(-1), 0.0)

    def _features(self, input_ids: Tensor, attention_mask: Tensor, step_index: Tensor | None) -> Tensor | None:
        if self.reference is None:
            return None
        if step_index is None:
            raise ValueError("a PRM with likelihood features needs step_index (B, L): see step_positions")
        return self.token_logprobs(input_ids, attention_mask)

    def member_logits(
        self, member: int, input_ids: Tensor, attention_mask: Tensor, step_index: Tensor | None = None
    ) -> Tensor:
        """Member ``member``'s step logit at every position: long (B, L) ids and mask -> (B, L).
        ``step_index`` (B, L), from :func:`step_positions`, is needed for likelihood features."""
        states = self.backbone_of(member)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self._head(member, states, self._features(input_ids, attention_mask, step_index), step_index)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, step_index: Tensor | None = None) -> Tensor:
        """Every member's logit at every position: (B, L) ids and mask -> (M, B, L).

        Rows are right-padded (the backbone numbers positions from 0 at column 0, as
        :func:`right_pad` lays them out). The caller reads the logits at step ends (see
        :func:`encode`); other positions mean nothing. A shared backbone runs once for all heads.
        """
        if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"expected input_ids and attention_mask of one shape (B, L), got "
                f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
            )
        token_lp = self._features(input_ids, attention_mask, step_index)  # once for every member
        outs = []
        for m in range(self.members):
            if m == 0 or not self.share_backbone:
                states = self.backbone_of(m)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            outs.append(self._head(m, states, token_lp, step_index))
        return torch.stack(outs)  # (M, B, L)

    @torch.no_grad()
    def member_scores(
        self,
        tokenizer: PreTrainedTokenizerBase,
        examples: Sequence[tuple[str, Sequence[str]]],
        *,
        batch_size: int = 32,
        max_len: int | None = None,
    ) -> list[Tensor]:
        """Each member's probability per step: one float tensor (M, n_steps) per example.

        Steps dropped by :func:`encode` (they do not fit in ``max_len``, default the
        backbone's maximum positions) score NaN, so every row keeps one entry per step.
        """
        max_len = self.max_positions if max_len is None else max_len
        was_training = self.training
        self.eval()
        out: list[Tensor] = []
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            encoded = [encode(tokenizer, prompt, steps, max_len=max_len) for prompt, steps in chunk]
            ids, mask = right_pad([e[0] for e in encoded], tokenizer.pad_token_id)
            index = torch.tensor(
                [
                    step_positions(ends, len(encode_prompt(tokenizer, prompt)), ids.shape[1])
                    for (prompt, _), (_, ends) in zip(chunk, encoded)
                ]
            )
            device = module_device(self)  # the PRM may sit on a GPU (policy.device); scores come back on the CPU
            probs = torch.sigmoid(self(ids.to(device), mask.to(device), index.to(device))).float().cpu()  # (M, B, L)
            for i, ((_, steps), (_, ends)) in enumerate(zip(chunk, encoded)):
                row = torch.full((self.members, len(steps)), float("nan"))
                row[:, : len(ends)] = probs[:, i, ends]
                out.append(row)
        self.train(was_training)
        return out

    def score(
        self,
        tokenizer: PreTrainedTokenizerBase,
        examples: Sequence[tuple[str, Sequence[str]]],
        *,
        batch_size: int = 32,
        max_len: int | None = None,
    ) -> list[list[float]]:
        """Per example ``(prompt, steps)``, per step, the members' probabilities combined by
        ``self.combine`` (NaN for steps that do not fit, see :meth:`member_scores`)."""
        fn = COMBINES[self.combine]
        rows = self.member_scores(tokenizer, examples, batch_size=batch_size, max_len=max_len)
        return [fn(r).tolist() for r in rows]

    def save(self, path: str | Path) -> Path:
        """Write ``backbone_<i>/`` (``save_pretrained``), ``heads.pt`` and ``prm_config.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for i, backbone in enumerate(self.backbones):
            backbone.save_pretrained(path / f"backbone_{i}")
        torch.save(self.heads.state_dict(), path / HEADS_FILE)
        if self.reference is not None:
            self.reference.save_pretrained(path / "reference")
            torch.save(self.feature_heads.state_dict(), path / LIKELIHOOD_FILE)
        config = {
            "version": FORMAT_VERSION,
            "members": self.members,
            "combine": self.combine,
            "backbones": len(self.backbones),
            "likelihood": self.likelihood,
        }
        (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> ProcessRewardModel:
        """Reload a PRM written by :meth:`save` (local files only)."""
        path = Path(path)
        config = json.loads((path / CONFIG_FILE).read_text())
        if config.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path / CONFIG_FILE}: format version {config.get('version')}, expected {FORMAT_VERSION}")
        backbones = [
            AutoModel.from_pretrained(path / f"backbone_{i}", local_files_only=True, dtype=torch.float32)
            for i in range(config["backbones"])
        ]
        reference = None
        if config.get("likelihood"):
            reference = AutoModelForCausalLM.from_pretrained(
                path / "reference", local_files_only=True, dtype=torch.float32
            )
        model = cls(backbones, members=config["members"], combine=config["combine"], reference=reference)
        model.heads.load_state_dict(torch.load(path / HEADS_FILE, weights_only=True))
        if reference is not None:
            model.feature_heads.load_state_dict(torch.load(path / LIKELIHOOD_FILE, weights_only=True))
        return model.eval()
