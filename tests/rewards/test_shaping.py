"""Shaping terms against slow loops and hand-worked numbers (DAPO's overlong punishment)."""

import math

import pytest
import torch

from creditrl.credit import estimate
from creditrl.losses.kl import kl_estimate
from creditrl.rewards.shaping import add_shaping, kl_penalty, length_penalty, overlong_penalty


def random_mask(seed, b=16, t=12):
    """Right-padded rows of random length with random holes (observation tokens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    return (torch.arange(t)[None, :] < lengths[:, None]) & (torch.rand(b, t, generator=g) > 0.25)


def valid_cols(mask, b):
    return [t for t in range(mask.shape[1]) if mask[b, t]]


def assert_off_mask_is_zero(delta, placed, mask):
    assert delta.dtype == torch.float32 and placed.dtype == torch.bool
    assert delta.shape == mask.shape == placed.shape
    assert not delta[~mask].any() and not (placed & ~mask).any()


# ----------------------------------------------------------------------------- length penalty


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [0, 1, 4, 20])
def test_length_penalty_matches_loop(seed, budget):
    mask = random_mask(seed)
    delta, placed = length_penalty(mask, budget=budget, coef=0.3)
    ref = torch.zeros(mask.shape)
    for b in range(mask.shape[0]):
        for rank, t in enumerate(valid_cols(mask, b)):
            if rank >= budget:
                ref[b, t] = -0.3
    assert torch.allclose(delta, ref) and torch.equal(placed, ref != 0)
    assert_off_mask_is_zero(delta, placed, mask)
    # the return falls by coef * max(0, L - budget)
    lengths = mask.sum(1).float()
    assert torch.allclose(delta.sum(1), -0.3 * (lengths - budget).clamp(min=0))


def test_length_penalty_by_hand_and_checks():
    mask = torch.tensor([[1, 0, 1, 1, 1, 0]], dtype=torch.bool)
    delta, placed = length_penalty(mask, budget=2, coef=1.0)
    assert delta.tolist() == [[0, 0, 0, -1.0, -1.0, 0]]
    with pytest.raises(ValueError, match="length penalty budget must be >= 0, got -1"):
        length_penalty(mask, budget=-1, coef=1.0)
    with pytest.raises(ValueError, match=r"response_mask must be bool \(B, T\), got torch.int64"):
        length_penalty(mask.long(), budget=1, coef=1.0)


# ----------------------------------------------------------------------------- overlong (DAPO)


def dapo(length, max_len, cache):
    if length <= max_len - cache:
        return 0.0
    if length <= max_len:
        return ((max_len - cache) - length) / cache
    return -1.0


def test_overlong_penalty_dapo_numbers_by_hand():
    # max_len 20, cache 4: free up to 16 tokens, then -1/4 per token, -1 beyond 20
    lengths = [0, 5, 16, 17, 18, 20, 21, 24]
    mask = torch.arange(24)[None, :] < torch.tensor(lengths)[:, None]
    delta, placed = overlong_penalty(mask, max_len=20, cache=4, coef=0.5)
    assert delta.sum(1).tolist() == [0.0, 0.0, 0.0, -0.125, -0.25, -0.5, -0.5, -0.5]
    # it lands on the last valid token, only where the penalty applies (L > 16)
    assert placed.nonzero().tolist() == [[3, 16], [4, 17], [5, 19], [6, 20], [7, 23]]
    assert_off_mask_is_zero(delta, placed, mask)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("max_len,cache", [(8, 3), (6, 6), (5, 0), (1, 1)])
def test_overlong_penalty_matches_loop(seed, max_len, cache):
    mask = random_mask(seed)
    delta, placed = overlong_penalty(mask, max_len=max_len, cache=cache, coef=2.0)
    ref = torch.zeros(mask.shape)
    ref_placed = torch.zeros(mask.shape, dtype=torch.bool)
    for b in range(mask.shape[0]):
        cols = valid_cols(mask, b)
        if cols and len(cols) > max_len - cache:
            ref[b, cols[-1]] = 2.0 * dapo(len(cols), max_len, cache)
            ref_placed[b, cols[-1]] = True
    assert torch.allclose(delta, ref) and torch.equal(placed, ref_placed)
    assert_off_mask_is_zero(delta, placed, mask)


def test_overlong_penalty_checks():
    mask = torch.ones(1, 3, dtype=torch.bool)
    for max_len, cache in [(0, 0), (4, 5), (4, -1)]:
        with pytest.raises(ValueError, match="overlong penalty needs max_len >= 1 and 0 <= cache <= max_len"):
            overlong_penalty(mask, max_len=max_len, cache=cache)


# ----------------------------------------------------------------------------- KL in the reward


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_matches_loop_and_ignores_masked_values(estimator):
    mask = random_mask(7)
    g = torch.Generator().manual_seed(3)
    logp = (-torch.rand(mask.shape, generator=g) * 3).requires_grad_()
    ref_logp = -torch.rand(mask.shape, generator=g) * 3
    delta, placed = kl_penalty(logp, ref_logp, mask, beta=0.05, estimator=estimator)
    ref = torch.zeros(mask.shape)
    for b in range(mask.shape[0]):
        for t in valid_cols(mask, b):
            r = float(logp[b, t].detach() - ref_logp[b, t])
            kl = {"k1": r, "k2": 0.5 * r * r, "k3": math.exp(-r) - 1 + r}[estimator]
            ref[b, t] = -0.05 * kl
    assert torch.allclose(delta, ref, atol=1e-6) and torch.equal(placed, mask)
    assert not delta.requires_grad  # a reward carries no gradient
    assert_off_mask_is_zero(delta, placed, mask)
    # garbage (nan, inf) on masked tokens cannot leak in
    noisy = torch.where(mask, logp.detach(), torch.nan)
    noisy_ref = torch.where(mask, ref_logp, -torch.inf)
    again, _ = kl_penalty(noisy, noisy_ref, mask, beta=0.05, estimator=estimator)
    assert torch.equal(again, delta)
    assert torch.allclose(delta, -0.05 * torch.where(mask, kl_estimate(logp.detach(), ref_logp, estimator), 0.0))


def test_kl_penalty_checks():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"logp and ref_logp must have the shape of response_mask \(2, 3\), got \(2, 3\) and \(3,\)"
    ):
        kl_penalty(torch.zeros(2, 3), torch.zeros(3), mask, beta=0.1)
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), mask, beta=0.1, estimator="k4")


# ----------------------------------------------------------------------------- add_shaping


def test_add_shaping_adds_deltas_and_ors_masks():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    rewards = torch.tensor([[0, 0, 0, 1.0, 0], [0, 0.5, 0, 0, 0]])
    reward_mask = torch.tensor([[0, 0, 0, 1, 0], [0, 1, 0, 0, 0]], dtype=torch.bool)
    terms = [length_penalty(mask, budget=2, coef=0.1), overlong_penalty(mask, max_len=3, cache=1)]
    out, out_mask = add_shaping(rewards, reward_mask, terms)
    assert torch.allclose(out, torch.tensor([[0, 0, -0.1, 1.0 - 0.1 - 1.0, 0], [0, 0.5, 0, 0, 0]]))
    assert out_mask.tolist() == [[False, False, True, True, False], [False, True, False, False, False]]
    assert rewards[0, 2].item() == 0.0 and not reward_mask[0, 2]  # inputs untouched
    same, same_mask = add_shaping(rewards, reward_mask, [])
    assert torch.equal(same, rewards) and torch.equal(same_mask, reward_mask)
    with pytest.raises(ValueError, match=r"shaping term 0: expected delta float and mask bool of shape \(2, 5\)"):
        add_shaping(rewards, reward_mask, [(torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.bool))])


def test_shaping_reaches_summing_estimators_as_part_of_the_return():
    """grpo sums every reward on a valid token: a length penalty lowers long responses' R_b."""
    mask = torch.arange(6)[None, :] < torch.tensor([2, 6])[:, None]
    rewards = torch.zeros(2, 6)
    rewards[0, 1] = rewards[1, 5] = 1.0  # both correct
    reward_mask = rewards != 0
    shaped, shaped_mask = add_shaping(rewards, reward_mask, [length_penalty(mask, budget=3, coef=0.25)])
    adv, ret = estimate("reinforce", shaped, shaped_mask, mask, group_ids=torch.tensor([0, 0]))
    assert ret[:, 0].tolist() == [1.0, 1.0 - 3 * 0.25]
