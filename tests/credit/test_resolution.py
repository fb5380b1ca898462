"""Step resolution: the step view against loops, VinePPO's step advantage, token == step."""

import pytest
import torch

from creditrl.credit import RESOLUTIONS, estimate, estimate_at, requires, step_view
from creditrl.credit.resolution import (
    any_to_steps,
    first_to_steps,
    from_steps,
    step_mask,
    sum_to_steps,
)

CRITIC_FREE = ["reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo", "grpo_process"]


def loop_steps(step_ends, response_mask):
    """Each row's steps as lists of token positions, by the rule in the module docstring."""
    rows = []
    for ends, valid in zip(step_ends.tolist(), response_mask.tolist(), strict=True):
        steps, current = [], []
        for t, (end, ok) in enumerate(zip(ends, valid, strict=True)):
            if not ok:
                continue
            current.append(t)
            if end:
                steps.append(current)
                current = []
        if current:
            steps.append(current)
        rows.append(steps)
    return rows


def make_batch(seed, dtype=torch.float64):
    """Random masks with holes and padding, step ends anywhere (also on masked tokens),
    rewards, values and group ids (sizes 1 to 4)."""
    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 9, (), generator=gen))
    T = int(torch.randint(1, 14, (), generator=gen))
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    response_mask = (torch.arange(T) < lengths[:, None]) & (torch.rand(B, T, generator=gen) > 0.2)
    step_ends = torch.rand(B, T, generator=gen) < 0.3
    reward_mask = torch.rand(B, T, generator=gen) < 0.4
    rewards = torch.where(reward_mask, torch.randn(B, T, generator=gen), 0.0).to(dtype)
    values = torch.randn(B, T, generator=gen).to(dtype)
    group_ids = torch.randint(0, 3, (B,), generator=gen) * 7
    return rewards, reward_mask, response_mask, step_ends, values, group_ids


@pytest.mark.parametrize("seed", range(20))
def test_step_view_and_compressions_match_loops(seed):
    rewards, reward_mask, response_mask, step_ends, values, _ = make_batch(seed)
    view = step_view(step_ends, response_mask)
    steps = loop_steps(step_ends, response_mask)
    K = max((len(s) for s in steps), default=0)
    assert view.max_steps == K
    assert view.num_steps.tolist() == [len(s) for s in steps]
    index = [[-1] * response_mask.shape[1] for _ in steps]
    for b, row in enumerate(steps):
        for k, step in enumerate(row):
            for t in step:
                index[b][t] = k
    assert view.step_index.tolist() == index

    def per_step(fn, pad):
        return [[fn(b, s) for s in row] + [pad] * (K - len(row)) for b, row in enumerate(steps)]

    r, v, placed = rewards.tolist(), values.tolist(), reward_mask.tolist()
    assert step_mask(view).tolist() == per_step(lambda b, s: True, False)
    sums = torch.tensor(per_step(lambda b, s: sum(r[b][t] for t in s), 0.0), dtype=torch.float64)
    assert torch.allclose(sum_to_steps(rewards, view), sums.reshape(len(steps), K), atol=1e-12)
    assert first_to_steps(values, view).tolist() == per_step(lambda b, s: v[b][s[0]], 0.0)
    anys = per_step(lambda b, s: any(placed[b][t] for t in s), False)
    assert any_to_steps(reward_mask, view).tolist() == anys

    # from_steps broadcasts step k's entry to its tokens and 0 to masked tokens.
    x_steps = torch.randn(len(steps), K, dtype=torch.float64)
    table = x_steps.tolist()
    expected = [[table[b][k] if k >= 0 else 0.0 for k in row] for b, row in enumerate(index)]
    assert from_steps(x_steps, view).tolist() == expected


def test_step_view_by_hand():
    response_mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0], [0] * 7, [1] * 7], dtype=torch.bool)
    step_ends = torch.tensor([[0, 1, 1, 0, 1, 0, 1], [1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 1]])
    view = step_view(step_ends.bool(), response_mask)
    # Row 0: ends at 1 and 4 (those at 2 and 6 sit on masked tokens), then a final open step {5}.
    assert view.step_index.tolist() == [
        [0, 0, -1, 1, 1, 2, -1],
        [-1] * 7,
        [0, 1, 1, 1, 1, 1, 1],
    ]
    assert view.num_steps.tolist() == [3, 0, 2] and view.max_steps == 3
    x = torch.arange(21.0).view(3, 7)
    assert sum_to_steps(x, view).tolist() == [[1.0, 7.0, 5.0], [0.0] * 3, [14.0, 105.0, 0.0]]
    assert first_to_steps(x, view).tolist() == [[0.0, 3.0, 5.0], [0.0] * 3, [14.0, 15.0, 0.0]]


def test_masked_entries_are_never_read():
    _, reward_mask, response_mask, step_ends, values, _ = make_batch(4)
    view = step_view(step_ends, response_mask)
    junk = torch.where(response_mask, values, float("nan"))
    assert torch.equal(sum_to_steps(junk, view), sum_to_steps(values, view))
    assert torch.equal(first_to_steps(junk, view), first_to_steps(values, view))
    flipped = torch.where(response_mask, reward_mask, ~reward_mask)
    assert torch.equal(any_to_steps(flipped, view), any_to_steps(reward_mask, view))
    moved = torch.where(response_mask, step_ends, ~step_ends)
    assert torch.equal(step_view(moved, response_mask).step_index, view.step_index)


def step_batch(seed, dtype=torch.float64):
    """Step-placed rewards (one per step, on its last token) and values constant within a step."""
    rewards, _, response_mask, step_ends, values, group_ids = make_batch(seed, dtype)
    view = step_view(step_ends, response_mask)
    last = torch.zeros_like(response_mask)
    for b, row in enumerate(loop_steps(step_ends, response_mask)):
        for step in row:
            last[b, step[-1]] = True
    rewards = torch.where(last, torch.randn(rewards.shape, dtype=dtype), 0.0)
    step_values = torch.randn(len(rewards), view.max_steps, dtype=dtype)  # V(s_k)
    values = torch.where(response_mask, from_steps(step_values, view), values)
    return rewards, last, response_mask, step_ends, values, group_ids


@pytest.mark.parametrize("seed", range(10))
def test_gae_at_step_resolution_is_vineppo(seed):
    rewards, reward_mask, response_mask, step_ends, values, _ = step_batch(seed)
    call = {"step_ends": step_ends, "values": values, "gamma": 1.0}
    td, _ = estimate_at("step", "gae", rewards, reward_mask, response_mask, lam=0.0, **call)
    mc, ret = estimate_at("step", "gae", rewards, reward_mask, response_mask, lam=1.0, **call)
    r, v = rewards.tolist(), values.tolist()
    for b, row in enumerate(loop_steps(step_ends, response_mask)):
        step_r = [sum(r[b][t] for t in s) for s in row]
        step_v = [v[b][s[0]] for s in row] + [0.0]  # V after the last step is 0
        for k, step in enumerate(row):
            vineppo = step_r[k] + step_v[k + 1] - step_v[k]
            to_go = sum(step_r[k:])
            for t in step:
                assert td[b, t].item() == pytest.approx(vineppo, abs=1e-12)
                assert mc[b, t].item() == pytest.approx(to_go - step_v[k], abs=1e-12)
                assert ret[b, t].item() == pytest.approx(to_go, abs=1e-12)
    assert (td[~response_mask] == 0).all() and (mc[~response_mask] == 0).all()


@pytest.mark.parametrize("seed", range(6))
def test_gamma_counts_steps_not_tokens(seed):
    rewards, reward_mask, response_mask, step_ends, _, _ = step_batch(seed)
    _, ret = estimate_at("step", "reinforce", rewards, reward_mask, response_mask, step_ends=step_ends, gamma=0.5)
    r = rewards.tolist()
    for b, row in enumerate(loop_steps(step_ends, response_mask)):
        step_r = [sum(r[b][t] for t in s) for s in row]
        for k, step in enumerate(row):
            expected = sum(0.5**j * x for j, x in enumerate(step_r[k:]))
            assert all(ret[b, t].item() == pytest.approx(expected, abs=1e-12) for t in step)


@pytest.mark.parametrize("name", CRITIC_FREE)
@pytest.mark.parametrize("seed", range(8))
def test_critic_free_estimators_agree_at_token_and_step_resolution(name, seed):
    # With gamma = 1 and one reward per step on its last token, the reward-to-go of any token
    # equals that of its step, the returns R_b and the pool of placed rewards are the same.
    rewards, reward_mask, response_mask, step_ends, _, group_ids = step_batch(seed)
    args = (name, rewards, reward_mask, response_mask)
    call = {"group_ids": group_ids, "gamma": 1.0}
    token = estimate_at("token", *args, **call)
    step = estimate_at("step", *args, step_ends=step_ends, **call)
    for a, b in zip(token, step, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_outcome_estimators_agree_for_any_reward_placement(name):
    # These see only R_b, so even rewards inside steps give the same advantages.
    rewards, reward_mask, response_mask, step_ends, _, group_ids = make_batch(9)
    args = (name, rewards, reward_mask, response_mask)
    token, _ = estimate_at("token", *args, group_ids=group_ids)
    step, _ = estimate_at("step", *args, step_ends=step_ends, group_ids=group_ids)
    assert torch.allclose(token, step, atol=1e-12)


def test_token_resolution_is_estimate():
    rewards, reward_mask, response_mask, step_ends, values, _ = make_batch(2)
    call = {"values": values, "gamma": 0.9, "lam": 0.7}
    direct = estimate("gae", rewards, reward_mask, response_mask, **call)
    routed = estimate_at("token", "gae", rewards, reward_mask, response_mask, **call)
    assert all(torch.equal(a, b) for a, b in zip(direct, routed, strict=True))


def test_every_token_of_a_step_shares_its_advantage():
    rewards, reward_mask, response_mask, step_ends, values, _ = make_batch(11)
    adv, _ = estimate_at(
        "step",
        "gae",
        rewards,
        reward_mask,
        response_mask,
        step_ends=step_ends,
        values=values,
        gamma=0.9,
        lam=0.9,
    )
    for b, row in enumerate(loop_steps(step_ends, response_mask)):
        for step in row:
            assert len({adv[b, t].item() for t in step}) == 1


def test_errors():
    rewards, reward_mask, response_mask, step_ends, values, _ = make_batch(1)
    args = (rewards, reward_mask, response_mask)
    assert RESOLUTIONS == ("token", "step")
    with pytest.raises(ValueError, match=r"unknown resolution 'segment'; valid: token, step"):
        estimate_at("segment", "reinforce", *args, step_ends=step_ends)
    with pytest.raises(ValueError, match=r"resolution 'step' needs step_ends .*; got None"):
        estimate_at("step", "reinforce", *args)
    with pytest.raises(ValueError, match=r"step_ends must be a bool tensor of shape"):
        estimate_at("step", "reinforce", *args, step_ends=step_ends.float())
    with pytest.raises(ValueError, match=r"rewards must be a floating-point tensor"):
        estimate_at("step", "reinforce", rewards[0], *args[1:], step_ends=step_ends)
    assert requires("gae") == {"values"}
    with pytest.raises(ValueError, match=r"estimator 'gae' needs values"):
        estimate_at("step", "gae", *args, step_ends=step_ends)
    with pytest.raises(ValueError, match=r"unknown estimator 'ppo'"):
        estimate_at("step", "ppo", *args, step_ends=step_ends, values=values)


def test_step_view_checks_its_masks():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"response_mask must be .* \(B, T\); got shape \(3,\)"):
        step_view(mask[0], mask[0])
    with pytest.raises(ValueError, match=r"response_mask must be a bool .*torch.float32"):
        step_view(mask, mask.float())
    with pytest.raises(ValueError, match=r"step_ends must be a bool .*\(2, 3\); got .*\(2, 2\)"):
        step_view(mask[:, :2], mask)
