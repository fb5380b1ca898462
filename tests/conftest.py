"""Shared test settings."""

import sys
from pathlib import Path

import pytest
import torch

# the repository's studies/ (one-off measurements, not the package) import as ``studies.NAME``
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from creditrl.rollout.batch import TrajectoryBatch

# One intra-op thread: on a loaded 2-core machine, two threads of tiny matmuls contend badly
# (a forward pass of the tiny model went from ~1.5 ms to ~270 ms); one thread is also deterministic.
torch.set_num_threads(1)


def _peaked_tiny(init_seed: int, weight_seed: int):
    """A small tiny-preset Llama whose next-token distributions are far from uniform.

    The default init (std 0.02, tied embeddings) gives near-uniform logits whose argmax is the
    input token, so greedy decoding would just repeat the prompt's last char and engine checks
    would be weak. Re-drawing the matrices at unit gain and scaling the final norm gives peaked,
    context-dependent distributions.
    """
    from creditrl.policy.model import TinyPreset, build_tiny, sharpen

    model, tok = build_tiny(init_seed, TinyPreset(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    return sharpen(model, weight_seed), tok


@pytest.fixture(scope="session")
def peaked_tiny():
    """Factory fixture: ``peaked_tiny(init_seed, weight_seed) -> (model, tokenizer)``."""
    return _peaked_tiny


def _scored_by(trainer, problems: list, completions: list[str], *, scorer=None, tokenizer=None, group_size: int = 0):
    """The score stage (the trainer's, or ``scorer`` with ``tokenizer``) on hand-written
    completions (each followed by eos); groups of ``group_size`` rows (0: one group)."""
    tok = tokenizer or trainer.parts.tokenizer
    rows = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    b, width = len(rows), max(len(r) for r in rows)
    lengths = torch.tensor([len(r) for r in rows])
    batch = TrajectoryBatch(
        prompt_ids=torch.full((b, 1), tok.bos_token_id),
        prompt_mask=torch.ones(b, 1, dtype=torch.long),
        response_ids=torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows]),
        response_lengths=lengths,
        response_mask=torch.arange(width)[None, :] < lengths[:, None],
        old_logprobs=torch.zeros(b, width),
        group_ids=torch.arange(b) // group_size if group_size else torch.zeros(b, dtype=torch.long),
        finished=torch.ones(b, dtype=torch.bool),
        extras={"problems": problems, "completions": completions},
    )
    return (scorer or trainer.parts.scorer)(batch, progress=0.0, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="session")
def scored_by():
    """Factory fixture: ``scored_by(trainer, problems, completions)`` runs the trainer's score
    stage on hand-written completions (each followed by eos); see :func:`_scored_by`."""
    return _scored_by
