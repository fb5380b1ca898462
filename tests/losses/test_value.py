"""The clipped value loss against a per-token loop; clip fraction and explained variance."""

import math

import pytest
import torch

from creditrl.losses import aggregate, clipped_value_loss, explained_variance, value_clipfrac


def loop_value_loss(values, old, returns, mask, clip_eps):
    """0.5 * max((V - R)^2, (old + clip(V - old) - R)^2) token by token; 0 on masked tokens."""
    out = []
    for v_r, o_r, r_r, m_r in zip(values.tolist(), old.tolist(), returns.tolist(), mask.tolist()):
        row = []
        for v, o, r, m in zip(v_r, o_r, r_r, m_r):
            if not m:
                row.append(0.0)
                continue
            loss = (v - r) ** 2
            if clip_eps is not None:
                clipped = o + min(max(v - o, -clip_eps), clip_eps)
                loss = max(loss, (clipped - r) ** 2)
            row.append(0.5 * loss)
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


def case(seed, b=5, t=9):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(b, t, generator=g, dtype=torch.float64)
    values = old + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64)  # some move > eps
    returns = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.7
    mask[0] = False  # an all-masked row
    return values, old, returns, mask


@pytest.mark.parametrize("clip_eps", [None, 0.0, 0.1, 0.2, 10.0])
@pytest.mark.parametrize("seed", range(5))
def test_clipped_value_loss_matches_loop(seed, clip_eps):
    values, old, returns, mask = case(seed)
    loss = clipped_value_loss(values, old, returns, mask, clip_eps=clip_eps)
    assert loss.shape == values.shape
    assert torch.allclose(loss, loop_value_loss(values, old, returns, mask, clip_eps), atol=1e-12)
    if clip_eps is not None:
        expected = [
            (o + min(max(v - o, -clip_eps), clip_eps) - r) ** 2 > (v - r) ** 2
            for v, o, r, m in zip(
                values.flatten().tolist(),
                old.flatten().tolist(),
                returns.flatten().tolist(),
                mask.flatten().tolist(),
                strict=True,
            )
            if m
        ]
        frac = value_clipfrac(values, old, returns, mask, clip_eps=clip_eps)
        assert frac == pytest.approx(sum(expected) / len(expected))


def test_clipped_value_loss_by_hand():
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.5, -0.5, 0.1]])
    returns = torch.tensor([[1.0, -1.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    loss = clipped_value_loss(values, old, returns, mask, clip_eps=0.2)
    # t=0: V moved towards R, clip to 0.2 gives the larger error (0.8^2 > 0.5^2) -> 0.32;
    # t=1: V moved away from R, the unclipped error is larger, 1.5^2 -> 1.125;
    # t=2: V moved away, 1.5^2 -> 1.125 (clipped: 1.2^2); t=3 masked.
    assert loss.tolist()[0] == pytest.approx([0.32, 1.125, 1.125, 0.0])
    assert value_clipfrac(values, old, returns, mask, clip_eps=0.2) == pytest.approx(1 / 3)
    plain = clipped_value_loss(values, old, returns, mask, clip_eps=None)
    assert plain.tolist()[0] == pytest.approx([0.125, 1.125, 1.125, 0.0])
    assert value_clipfrac(values, old, returns, mask, clip_eps=None) == 0.0
    # Reduced by the shared aggregation: token-mean over the 3 valid tokens.
    assert aggregate("token-mean", loss, mask).item() == pytest.approx((0.32 + 2.25) / 3)


def test_clip_never_lowers_the_loss_and_gradients_skip_masked_tokens():
    values, old, returns, mask = case(7)
    plain = clipped_value_loss(values, old, returns, mask, clip_eps=None)
    clipped = clipped_value_loss(values, old, returns, mask, clip_eps=0.1)
    assert (clipped >= plain).all()
    junk = torch.where(mask, values, float("nan")).requires_grad_(True)
    inf_returns = torch.where(mask, returns, float("inf"))
    loss = clipped_value_loss(junk, old, inf_returns, mask, clip_eps=0.1)
    assert torch.equal(loss, clipped)
    aggregate("token-mean", loss, mask).backward()
    assert (junk.grad[~mask] == 0).all() and torch.isfinite(junk.grad).all()


def test_explained_variance_known_values():
    g = torch.Generator().manual_seed(0)
    returns = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) < 0.7
    junk = torch.where(mask, returns, 1e9)  # masked entries are not read
    assert explained_variance(returns, junk, mask) == pytest.approx(1.0)
    mean = torch.full_like(returns, returns[mask].mean().item())
    assert explained_variance(mean, returns, mask) == pytest.approx(0.0, abs=1e-12)
    # Residuals with half the spread of the returns explain 1 - 1/4 of their variance.
    half = returns - 0.5 * (returns - returns[mask].mean())
    assert explained_variance(half, returns, mask) == pytest.approx(0.75)
    worse = returns + 2 * (returns - returns[mask].mean())
    assert explained_variance(worse, returns, mask) == pytest.approx(-3.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_explained_variance_without_spread_is_zero_not_nan(dtype):
    mask = torch.ones(3, 7, dtype=torch.bool)
    constant = torch.full((3, 7), 0.3, dtype=dtype)  # its float32 mean is not exactly 0.3
    values = torch.randn(3, 7, dtype=dtype)
    assert explained_variance(values, constant, mask) == 0.0
    one = torch.zeros(3, 7, dtype=torch.bool)
    one[1, 2] = True
    assert explained_variance(values, values + 1, one) == 0.0
    none = torch.zeros(3, 7, dtype=torch.bool)
    result = explained_variance(values, values, none)
    assert result == 0.0 and not math.isnan(result)


def test_explained_variance_of_returns_that_vary_only_by_rounding_is_zero():
    # R = A + V at lambda 1 with no reward: returns 0 up to float32 rounding of the values
    torch.manual_seed(0)
    values = torch.randn(4, 9)
    returns = (-values) + values + 1e-9 * torch.randn(4, 9)
    mask = torch.ones(4, 9, dtype=torch.bool)
    assert explained_variance(values, returns, mask) == 0.0
    # a spread just above the bound is real variance again (the ratio is finite and negative)
    returns = 1e-5 * torch.randn(4, 9)
    assert -1e12 < explained_variance(values, returns, mask) < 0


def test_explained_variance_at_lambda_1_without_reward_is_zero_at_any_length():
    # The sparse long regime: a batch with no success, 860-token responses, returns A + V from
    # float32 GAE at lambda 1 -- the rewards to go (0) plus T accumulated roundings of the values.
    from creditrl.credit.gae import gae

    g = torch.Generator().manual_seed(0)
    for t in (9, 100, 860, 2000):
        values = 0.3 + torch.randn(8, t, generator=g)
        mask = torch.ones(8, t, dtype=torch.bool)
        _, returns = gae(torch.zeros(8, t), mask, mask, values=values, lam=1.0)
        assert 0 < float(returns.abs().max()) < 1e-4  # not exactly 0: rounding
        assert explained_variance(values, returns, mask) == 0.0
        one = torch.zeros(8, t)
        one[3, -1] = 1.0  # one success: the returns vary, the ratio is real again
        _, returns = gae(one, mask, mask, values=values, lam=1.0)
        ev = explained_variance(values, returns, mask)
        assert ev == pytest.approx(
            1 - (returns - values)[mask].double().var().item() / returns[mask].double().var().item()
        )
        assert -1e3 < ev < 0
