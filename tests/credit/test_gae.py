"""GAE and the blocked discounted cumsum against slow per-row loops, plus identities and masks."""

import pytest
import torch

from creditrl.credit import ESTIMATORS, discounted_cumsum, estimate, requires, reward_to_go
from creditrl.credit.estimators import BLOCK

GAMMA_LAM = [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (0.0, 0.0), (0.99, 0.95), (0.9, 0.5), (0.5, 1.0)]


def loop_cumsum(x, c):
    """The sequential recursion y_t = x_t + c * y_{t+1}, y_T = 0 (the former implementation)."""
    out = torch.empty_like(x)
    running = x.new_zeros(x.shape[0])
    for t in range(x.shape[1] - 1, -1, -1):
        running = x[:, t] + c * running
        out[:, t] = running
    return out


def loop_gae(rewards, response_mask, values, gamma, lam):
    """GAE per row over Python floats: walk the valid positions backwards, skipping holes."""
    r, v, m = rewards.tolist(), values.tolist(), response_mask.tolist()
    B, T = rewards.shape
    adv, ret = [[0.0] * T for _ in range(B)], [[0.0] * T for _ in range(B)]
    for b in range(B):
        next_value, next_adv = 0.0, 0.0  # V_{L_b} = 0, A_{L_b} = 0
        for t in reversed([t for t in range(T) if m[b][t]]):
            delta = r[b][t] + gamma * next_value - v[b][t]
            next_adv = delta + gamma * lam * next_adv
            next_value = v[b][t]
            adv[b][t], ret[b][t] = next_adv, next_adv + v[b][t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def make_batch(seed, dtype=torch.float32, max_b=9, max_t=12):
    """Random B and T, trailing padding, holes inside rows, empty rows, rewards on a random subset
    of tokens (some of them masked), values everywhere."""
    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, max_b, (), generator=gen))
    T = int(torch.randint(1, max_t, (), generator=gen))
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    holes = torch.rand(B, T, generator=gen) < 0.25
    response_mask = (torch.arange(T) < lengths[:, None]) & ~holes
    reward_mask = torch.rand(B, T, generator=gen) < 0.4
    rewards = torch.where(reward_mask, torch.randn(B, T, generator=gen), 0.0).to(dtype)
    values = torch.randn(B, T, generator=gen).to(dtype)
    return rewards, reward_mask, response_mask, values


def tolerance(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAM)
@pytest.mark.parametrize("seed", range(12))
def test_gae_matches_loop(seed, gamma, lam, dtype):
    rewards, reward_mask, response_mask, values = make_batch(seed, dtype)
    adv, ret = estimate("gae", rewards, reward_mask, response_mask, values=values, gamma=gamma, lam=lam)
    ref_adv, ref_ret = loop_gae(rewards, response_mask, values, gamma, lam)
    assert adv.dtype == ret.dtype == dtype
    atol = tolerance(dtype)
    assert torch.allclose(adv.double(), ref_adv, atol=atol, rtol=atol), (adv, ref_adv)
    assert torch.allclose(ret.double(), ref_ret, atol=atol, rtol=atol), (ret, ref_ret)


@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_loop_across_several_blocks(seed):
    # T > 2 * BLOCK runs the block-carry path that short random batches never reach.
    gen = torch.Generator().manual_seed(seed)
    B, T = 3, 2 * BLOCK + 37
    lengths = torch.tensor([T, T - 50, BLOCK + 1])
    response_mask = (torch.arange(T) < lengths[:, None]) & (torch.rand(B, T, generator=gen) > 0.1)
    rewards = torch.randn(B, T, generator=gen, dtype=torch.float64)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv, ret = estimate("gae", rewards, response_mask, response_mask, values=values, gamma=0.99, lam=0.95)
    ref_adv, ref_ret = loop_gae(rewards, response_mask, values, 0.99, 0.95)
    assert torch.allclose(adv, ref_adv, atol=1e-10) and torch.allclose(ret, ref_ret, atol=1e-10)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
@pytest.mark.parametrize("seed", range(6))
def test_lam_one_is_reward_to_go_minus_value(seed, gamma):
    rewards, reward_mask, response_mask, values = make_batch(seed, torch.float64)
    adv, ret = estimate("gae", rewards, reward_mask, response_mask, values=values, gamma=gamma)
    g = reward_to_go(rewards, response_mask, gamma)
    assert torch.allclose(adv, torch.where(response_mask, g - values, 0), atol=1e-12)
    assert torch.allclose(ret, g, atol=1e-12)  # the lambda-return with lam = 1 is G


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("seed", range(6))
def test_lam_zero_is_one_step_td_error(seed, gamma):
    rewards, reward_mask, response_mask, values = make_batch(seed, torch.float64)
    adv, _ = estimate("gae", rewards, reward_mask, response_mask, values=values, gamma=gamma, lam=0.0)
    for b in range(len(rewards)):
        valid = response_mask[b].nonzero().flatten().tolist()
        for i, t in enumerate(valid):
            v_next = values[b, valid[i + 1]] if i + 1 < len(valid) else 0.0
            delta = rewards[b, t] + gamma * v_next - values[b, t]
            assert adv[b, t].item() == pytest.approx(delta.item(), abs=1e-12)


@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAM)
def test_returns_are_advantages_plus_values_on_valid_tokens(gamma, lam):
    rewards, reward_mask, response_mask, values = make_batch(3, torch.float64)
    adv, ret = estimate("gae", rewards, reward_mask, response_mask, values=values, gamma=gamma, lam=lam)
    assert torch.allclose(ret, torch.where(response_mask, adv + values, 0), atol=1e-12)


def test_gae_by_hand():
    # One row with a hole at t=1 (its reward 9 and value 7 are ignored), then trailing padding.
    rewards = torch.tensor([[0.0, 9.0, 1.0, 2.0, 5.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 7.0, 1.0, 4.0, 3.0]], dtype=torch.float64)
    response_mask = torch.tensor([[1, 0, 1, 1, 0]], dtype=torch.bool)
    adv, ret = estimate("gae", rewards, response_mask, response_mask, values=values, gamma=0.5, lam=0.5)
    # delta: t=3: 2 + 0 - 4 = -2; t=2: 1 + 0.5*4 - 1 = 2; t=0: 0 + 0.5*1 - 0.5 = 0.
    # A: t=3: -2; t=2: 2 + 0.25*(-2) = 1.5; t=0: 0 + 0.25*1.5 = 0.375.
    assert adv.tolist() == [[0.375, 0.0, 1.5, -2.0, 0.0]]
    assert ret.tolist() == [[0.875, 0.0, 2.5, 2.0, 0.0]]


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.8)])
@pytest.mark.parametrize("seed", range(4))
def test_masked_positions_cannot_change_outputs(seed, gamma, lam):
    rewards, reward_mask, response_mask, values = make_batch(seed)
    options = {"gamma": gamma, "lam": lam}
    base = estimate("gae", rewards, reward_mask, response_mask, values=values, **options)
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30])[seed]
    masked = ~response_mask
    out = estimate(
        "gae",
        torch.where(masked, junk, rewards),
        torch.where(masked, ~reward_mask, reward_mask),
        response_mask,
        values=torch.where(masked, junk, values),
        **options,
    )
    for a, b in zip(base, out, strict=True):
        assert torch.equal(a, b)
        assert (b[masked] == 0).all()


def test_reward_mask_is_unused():
    # Like the other estimators but grpo_process, every reward on a valid token counts.
    rewards, reward_mask, response_mask, values = make_batch(2)
    a = estimate("gae", rewards, reward_mask, response_mask, values=values, gamma=0.9, lam=0.9)
    b = estimate("gae", rewards, ~reward_mask, response_mask, values=values, gamma=0.9, lam=0.9)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_missing_values_raise_the_registry_error():
    rewards, reward_mask, response_mask, _ = make_batch(1)
    assert requires("gae") == {"values"}
    message = r"estimator 'gae' needs values \(a float \(B, T\) tensor\); got None"
    with pytest.raises(ValueError, match=message):
        estimate("gae", rewards, reward_mask, response_mask)
    with pytest.raises(ValueError, match=message):
        ESTIMATORS["gae"](rewards, reward_mask, response_mask)


def test_bad_lam_is_refused():
    rewards, reward_mask, response_mask, values = make_batch(1)
    with pytest.raises(ValueError, match=r"lam must lie in \[0, 1\]; got 1.2"):
        estimate("gae", rewards, reward_mask, response_mask, values=values, lam=1.2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", [0.0, 0.3, 0.9, 0.99, 0.9999, 1.0])
@pytest.mark.parametrize("length", [0, 1, 5, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7, 4200])
def test_discounted_cumsum_matches_the_loop(length, c, dtype):
    gen = torch.Generator().manual_seed(length)
    x = torch.randn(5, length, generator=gen).to(dtype)
    fast = discounted_cumsum(x, c)
    assert fast.shape == x.shape and fast.dtype == dtype
    # Relative to sum_s c^(s-t) |x_s|: the scale of the rounding error of either order of sums.
    scale = loop_cumsum(x.abs(), c)
    error = (fast - loop_cumsum(x, c)).abs()
    assert (error <= tolerance(dtype) * scale).all()


def test_discounted_cumsum_gamma_zero_is_identity_and_long_rows_stay_finite():
    x = torch.randn(2, 300)
    assert torch.equal(discounted_cumsum(x, 0.0), x)  # 0^0 = 1 on the diagonal, 0 elsewhere
    # A closed form through c^-t would overflow here (0.5^-20000); the blocked scan must not.
    ones = torch.ones(1, 20000)
    y = discounted_cumsum(ones, 0.5)
    assert torch.isfinite(y).all()
    assert torch.allclose(y[0, :-60], torch.full((20000 - 60,), 2.0))
    assert y[0, -1].item() == 1.0
