"""Shared test settings."""

import pytest
import torch

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
    import math

    from creditrl.policy.model import TinyPreset, build_tiny

    model, tok = build_tiny(init_seed, TinyPreset(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    gen = torch.Generator().manual_seed(weight_seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
        model.model.norm.weight.fill_(3.0)
    return model.eval(), tok


@pytest.fixture(scope="session")
def peaked_tiny():
    """Factory fixture: ``peaked_tiny(init_seed, weight_seed) -> (model, tokenizer)``."""
    return _peaked_tiny
