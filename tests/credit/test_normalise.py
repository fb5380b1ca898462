"""Normalisers: whitening statistics over valid tokens, per batch and per group."""

import statistics

import pytest
import torch

from creditrl.credit import NORMALISERS, normalise
from creditrl.credit.normalise import register_normaliser

EPS = 1e-6


def make_batch(seed, dtype=torch.float32):
    """Advantages (B, T) with trailing padding, holes, and groups with sparse unsorted ids."""
    gen = torch.Generator().manual_seed(seed)
    B, T = 9, 7
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    holes = torch.rand(B, T, generator=gen) < 0.2
    response_mask = (torch.arange(T) < lengths[:, None]) & ~holes
    response_mask[:, 0] = True  # every response keeps a token, so each group has several
    advantages = (3 * torch.randn(B, T, generator=gen) + 1).to(dtype)
    group_ids = torch.tensor([40, 2, 40, 17, 2, 40, 17, 2, 17])
    return advantages, response_mask, group_ids


def test_batch_whitening_has_mean_zero_and_std_one_over_valid_tokens():
    advantages, response_mask, _ = make_batch(0)
    out = normalise("batch", advantages, response_mask)
    valid = out[response_mask].double()
    assert abs(valid.mean().item()) < 1e-6
    assert abs(valid.std().item() - 1.0) < 1e-5
    assert (out[~response_mask] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_whitening_matches_reference_per_group(dtype):
    advantages, response_mask, group_ids = make_batch(1, dtype)
    out = normalise("group", advantages, response_mask, group_ids=group_ids)
    a, m, g = advantages.tolist(), response_mask.tolist(), group_ids.tolist()
    expected = [[0.0] * len(a[0]) for _ in a]
    for gid in set(g):
        rows = [b for b in range(len(a)) if g[b] == gid]
        pool = [a[b][t] for b in rows for t in range(len(a[b])) if m[b][t]]
        mu, sd = statistics.mean(pool), statistics.stdev(pool)
        for b in rows:
            for t in range(len(a[b])):
                if m[b][t]:
                    expected[b][t] = (a[b][t] - mu) / (sd + EPS)
    assert out.dtype == dtype
    assert torch.allclose(out.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5)
    for gid in set(g):
        valid = out[(group_ids == gid)[:, None] & response_mask].double()
        assert abs(valid.mean().item()) < 1e-6 and abs(valid.std().item() - 1.0) < 1e-5


def test_none_keeps_valid_tokens_and_zeroes_masked_ones():
    advantages, response_mask, _ = make_batch(2)
    out = normalise("none", advantages, response_mask)
    assert torch.equal(out, torch.where(response_mask, advantages, 0))


@pytest.mark.parametrize("name", ["none", "batch", "group"])
def test_masked_positions_cannot_change_outputs(name):
    advantages, response_mask, group_ids = make_batch(3)
    base = normalise(name, advantages, response_mask, group_ids=group_ids)
    junk = torch.where(response_mask, advantages, float("nan"))
    out = normalise(name, junk, response_mask, group_ids=group_ids)
    assert torch.equal(base, out)
    assert torch.isfinite(out).all() and (out[~response_mask] == 0).all()


@pytest.mark.parametrize("name", ["batch", "group"])
def test_zero_spread_and_empty_inputs_give_zero_not_nan(name):
    ids = torch.zeros(7, dtype=torch.long)
    mask = torch.ones(7, 3, dtype=torch.bool)
    # In float32 a naive mean of 21 x 0.3 is off by rounding noise that (0 + eps) would amplify.
    assert torch.equal(normalise(name, torch.full((7, 3), 0.3), mask, group_ids=ids), torch.zeros(7, 3))
    empty = torch.zeros(7, 3, dtype=torch.bool)
    assert torch.equal(normalise(name, torch.randn(7, 3), empty, group_ids=ids), torch.zeros(7, 3))
    single = torch.zeros(7, 3, dtype=torch.bool)
    single[4, 1] = True  # one valid token: nothing to compare it with
    assert torch.equal(normalise(name, torch.randn(7, 3), single, group_ids=ids), torch.zeros(7, 3))


def test_errors():
    advantages, response_mask, group_ids = make_batch(4)
    with pytest.raises(ValueError) as info:
        normalise("whiten", advantages, response_mask)
    assert str(info.value) == f"unknown normaliser 'whiten'; valid: {', '.join(sorted(NORMALISERS))}"
    with pytest.raises(ValueError, match="normaliser 'group' needs group_ids"):
        normalise("group", advantages, response_mask)
    with pytest.raises(ValueError, match=r"response_mask must be a bool tensor .* got dtype torch.float32"):
        normalise("batch", advantages, response_mask.float())
    with pytest.raises(ValueError, match=r"advantages must be a floating-point tensor .* shape \(9,\)"):
        normalise("batch", advantages[:, 0], response_mask)
    with pytest.raises(ValueError, match=r"group_ids .* = \(9,\); got dtype torch.int64, shape \(4,\)"):
        normalise("group", advantages, response_mask, group_ids=group_ids[:4])
    with pytest.raises(ValueError, match="normaliser 'batch' is already registered"):
        register_normaliser("batch")(lambda advantages, response_mask, *, group_ids=None: advantages)
    assert sorted(NORMALISERS) == ["batch", "group", "none"]
