"""Estimators against slow pure-Python reference loops, plus identities, masks and errors."""

import statistics

import pytest
import torch

from creditrl.credit import (
    ESTIMATORS,
    estimate,
    register_estimator,
    registry,
    requires,
    reward_to_go,
)
from creditrl.credit.estimators import compact, expand

EPS = 1e-6
NAMES = ["reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo", "grpo_process", "min_form"]
GROUPED = [n for n in NAMES if n != "reinforce"]
DYADIC = torch.tensor([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0])  # exact sums: ties stay ties


def reference(name, rewards, reward_mask, response_mask, group_ids, gamma):
    """The spec written as plain loops over Python floats, independent of the vectorised code."""
    r, placed = rewards.tolist(), reward_mask.tolist()
    m, gid = response_mask.tolist(), group_ids.tolist()
    B, T = rewards.shape
    valid = [[t for t in range(T) if m[b][t]] for b in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for i, t in enumerate(valid[b]):
            ret[b][t] = sum(gamma**k * r[b][s] for k, s in enumerate(valid[b][i:]))
    if name == "min_form":  # no discount; the return is the worst placed reward from t on
        for b in range(B):
            for i, t in enumerate(valid[b]):
                ahead = [r[b][s] for s in valid[b][i:] if placed[b][s]]
                ret[b][t] = min(ahead) if ahead else 0.0
    R = [sum(r[b][s] for s in valid[b]) for b in range(B)]
    worst = [min((r[b][s] for s in valid[b] if placed[b][s]), default=0.0) for b in range(B)]
    members = {}
    for b in range(B):
        members.setdefault(gid[b], []).append(b)
    adv = [[0.0] * T for _ in range(B)]
    for b in range(B):
        group = members[gid[b]]
        n = len(group)
        for i, t in enumerate(valid[b]):
            if name == "reinforce":
                adv[b][t] = ret[b][t]
            elif name == "reinforce_baseline":
                adv[b][t] = ret[b][t] - statistics.mean(R[j] for j in group)
            elif name == "rloo" and n > 1:
                adv[b][t] = ret[b][t] - statistics.mean(R[j] for j in group if j != b)
            elif name == "grpo" and n > 1:
                scores = [R[j] for j in group]
                adv[b][t] = (R[b] - statistics.mean(scores)) / (statistics.stdev(scores) + EPS)
            elif name == "dr_grpo":
                adv[b][t] = R[b] - statistics.mean(R[j] for j in group)
            elif name == "min_form" and n > 1:
                adv[b][t] = ret[b][t] - statistics.mean(worst[j] for j in group if j != b)
            elif name == "grpo_process" and n > 1:
                pool = [r[j][s] for j in group for s in valid[j] if placed[j][s]]
                if len(pool) >= 2:
                    mu, sd = statistics.mean(pool), statistics.stdev(pool)
                    later = [s for s in valid[b][i:] if placed[b][s]]
                    adv[b][t] = sum((r[b][s] - mu) / (sd + EPS) for s in later)
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def make_batch(seed, dtype=torch.float32):
    """Random (B, T) inputs: trailing padding, holes inside responses, empty responses, rewards
    placed on masked positions, sparse unsorted group ids (often size 1), zero-spread groups."""
    gen = torch.Generator().manual_seed(seed)
    B, T = int(torch.randint(1, 9, (), generator=gen)), int(torch.randint(1, 10, (), generator=gen))
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    holes = torch.rand(B, T, generator=gen) < 0.2
    response_mask = (torch.arange(T) < lengths[:, None]) & ~holes
    reward_mask = torch.rand(B, T, generator=gen) < 0.35
    if seed % 2:
        raw = DYADIC[torch.randint(0, len(DYADIC), (B, T), generator=gen)]
    else:
        raw = torch.randn(B, T, generator=gen)
    group_ids = torch.tensor([11, -3, 7, 100])[torch.randint(0, 4, (B,), generator=gen)]
    # Zero spread in the first row's group: equal placed rewards (seed % 3 == 0) or all zero.
    same = (group_ids == group_ids[0])[:, None]
    if seed % 3 == 0:
        raw = torch.where(same, 0.5, raw)
    elif seed % 3 == 1:
        raw = torch.where(same, 0.0, raw)
    rewards = torch.where(reward_mask, raw, 0.0).to(dtype)
    return rewards, reward_mask, response_mask, group_ids


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(16))
def test_matches_reference_loop(name, gamma, dtype, seed):
    rewards, reward_mask, response_mask, group_ids = make_batch(seed, dtype)
    adv, ret = estimate(name, rewards, reward_mask, response_mask, group_ids=group_ids, gamma=gamma)
    ref_adv, ref_ret = reference(name, rewards, reward_mask, response_mask, group_ids, gamma)
    assert adv.dtype == ret.dtype == dtype
    atol = 1e-5 if dtype == torch.float32 else 1e-9
    assert torch.allclose(adv.double(), ref_adv, atol=atol), (adv, ref_adv)
    assert torch.allclose(ret.double(), ref_ret, atol=atol), (ret, ref_ret)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_compact_expand_and_reward_to_go(gamma):
    rewards, _, response_mask, _ = make_batch(5)
    packed, order = compact(rewards, response_mask)
    assert torch.equal(expand(packed, order, response_mask), torch.where(response_mask, rewards, 0))
    # Valid entries land left-aligned: column k is filled exactly when k < valid count.
    filled = torch.arange(rewards.shape[1]) < response_mask.sum(1, keepdim=True)
    assert torch.equal(response_mask.gather(1, order), filled)
    one_group = torch.zeros(len(rewards), dtype=torch.long)
    _, ref_ret = reference("reinforce", rewards, response_mask, response_mask, one_group, gamma)
    assert torch.allclose(reward_to_go(rewards, response_mask, gamma).double(), ref_ret, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("seed", range(4))
def test_masked_positions_cannot_change_outputs(name, gamma, seed):
    rewards, reward_mask, response_mask, group_ids = make_batch(seed)
    values = torch.randn(rewards.shape)
    options = {"group_ids": group_ids, "gamma": gamma}
    base = estimate(name, rewards, reward_mask, response_mask, values=values, **options)
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30])[seed]
    masked = ~response_mask
    rewards2 = torch.where(masked, junk, rewards)
    values2 = torch.where(masked, junk, values)
    reward_mask2 = torch.where(masked, ~reward_mask, reward_mask)
    out = estimate(name, rewards2, reward_mask2, response_mask, values=values2, **options)
    for a, b in zip(base, out, strict=True):
        assert torch.equal(a, b)
        assert torch.isfinite(b).all()
        assert (b[masked] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_all_masked_rows_give_zeros_not_nan(name):
    rewards = torch.randn(4, 5)
    response_mask = torch.zeros(4, 5, dtype=torch.bool)
    response_mask[2, :3] = True  # only row 2 has valid tokens; groups {0, 1} are fully masked
    group_ids = torch.tensor([0, 0, 1, 1])
    adv, ret = estimate(name, rewards, rewards != 0, response_mask, group_ids=group_ids, gamma=0.9)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[:2] == 0).all() and (ret[:2] == 0).all()
    empty = torch.zeros(3, 4, dtype=torch.bool)
    adv, ret = estimate(name, torch.ones(3, 4), empty, empty, group_ids=torch.zeros(3, dtype=torch.long))
    assert (adv == 0).all() and (ret == 0).all()


@pytest.mark.parametrize("name", ["grpo", "grpo_process"])
def test_zero_spread_group_is_exactly_zero(name):
    # In float32, sum(7 x 0.3) / 7 != 0.3: a naive mean leaves noise that (0 + eps) amplifies.
    reward_mask = torch.zeros(7, 4, dtype=torch.bool)
    reward_mask[:, -1] = True
    rewards = torch.where(reward_mask, 0.3, 0.0)
    mask = torch.ones(7, 4, dtype=torch.bool)
    adv, _ = estimate(name, rewards, reward_mask, mask, group_ids=torch.full((7,), 9))
    assert torch.equal(adv, torch.zeros(7, 4))


def sequence_level(seed, n_groups, size):
    """Equal-size groups, every response non-empty, one reward on its last valid token."""
    gen = torch.Generator().manual_seed(seed)
    B, T = n_groups * size, 6
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    holes = (torch.rand(B, T, generator=gen) < 0.2) & (torch.arange(T) < lengths[:, None] - 1)
    response_mask = (torch.arange(T) < lengths[:, None]) & ~holes
    reward_mask = torch.arange(T) == (lengths - 1)[:, None]
    rewards = torch.where(reward_mask, torch.randn(B, 1, generator=gen), 0.0)
    group_ids = torch.randperm(B, generator=gen) % n_groups * 5  # shuffled, non-contiguous ids
    return rewards, reward_mask, response_mask, group_ids


@pytest.mark.parametrize("size", [2, 3, 4])
def test_rloo_is_scaled_dr_grpo_on_equal_groups(size):
    batch = sequence_level(size, n_groups=3, size=size)
    rloo, _ = estimate("rloo", *batch[:3], group_ids=batch[3])
    dr, _ = estimate("dr_grpo", *batch[:3], group_ids=batch[3])
    assert torch.allclose(rloo, size / (size - 1) * dr, atol=1e-6)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_baseline_with_one_group_is_reinforce_minus_mean(gamma):
    rewards, reward_mask, response_mask, _ = make_batch(7)
    one = torch.zeros(len(rewards), dtype=torch.long)
    base, _ = estimate("reinforce_baseline", rewards, reward_mask, response_mask, group_ids=one, gamma=gamma)
    plain, _ = estimate("reinforce", rewards, reward_mask, response_mask, gamma=gamma)
    mean = torch.where(response_mask, rewards, 0).sum(1).mean()
    assert torch.allclose(base, torch.where(response_mask, plain - mean, 0), atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_grpo_process_equals_grpo_for_sequence_rewards(seed):
    # One placed reward per response: the pooled rewards are the returns R_j, normalised with
    # the same mean and sample std, and each sits on the last valid token, so A[b, t] = r~_b.
    rewards, reward_mask, response_mask, _ = sequence_level(seed, n_groups=4, size=2)
    group_ids = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])  # sizes 3, 2, 1, 2
    if seed % 2:
        rewards = torch.where(group_ids[:, None] == 3, reward_mask * 0.7, rewards)  # zero spread
    process, _ = estimate("grpo_process", rewards, reward_mask, response_mask, group_ids=group_ids)
    outcome, _ = estimate("grpo", rewards, reward_mask, response_mask, group_ids=group_ids)
    assert torch.allclose(process, outcome, atol=1e-6)
    assert (process[group_ids == 2] == 0).all()


def test_rloo_by_hand():
    rewards = torch.tensor(
        [
            [0.0, 0.0, 1.0],  # group 4
            [0.0, 0.0, 0.0],  # group 4
            [0.0, 0.0, 2.0],  # group 4
            [1.0, 9.0, 2.0],  # group 8, with a hole at t=1
            [1.0, 0.0, 0.0],  # group 8
            [3.0, 0.0, 0.0],  # group 6, alone
        ]
    )
    response_mask = torch.ones(6, 3, dtype=torch.bool)
    response_mask[3, 1] = False
    group_ids = torch.tensor([4, 4, 4, 8, 8, 6])
    adv, ret = estimate("rloo", rewards, rewards != 0, response_mask, group_ids=group_ids, gamma=0.5)
    # Row 0: G = [0.25, 0.5, 1], baseline (0 + 2) / 2 = 1; row 2: G = [0.5, 1, 2], baseline 0.5.
    # Row 3: G = [1 + 0.5 * 2, -, 2] = [2, 0, 2] (the hole does not advance the discount),
    # R = 3, baseline = R_4 = 1; row 4: G = [1, 0, 0], baseline = R_3 = 3.
    expected = torch.tensor(
        [
            [-0.75, -0.5, 0.0],
            [-1.5, -1.5, -1.5],
            [0.0, 0.5, 1.5],
            [1.0, 0.0, 1.0],
            [-2.0, -3.0, -3.0],
            [0.0, 0.0, 0.0],
        ]
    )
    assert torch.allclose(adv, expected)
    assert torch.allclose(ret[3], torch.tensor([2.0, 0.0, 2.0]))


def test_grpo_process_by_hand():
    rewards = torch.tensor([[0.0, 3.0, 0.0, 1.0], [0.0, 100.0, 4.0, 0.0], [1.0, 0.0, 5.0, 0.0]])
    reward_mask = torch.tensor([[0, 1, 0, 1], [1, 1, 1, 0], [1, 0, 1, 0]], dtype=torch.bool)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    group_ids = torch.tensor([2, 2, 5])  # row 2 is alone: 0 despite two placed rewards
    adv, _ = estimate("grpo_process", rewards, reward_mask, response_mask, group_ids=group_ids)
    # Pool {3, 1, 0, 4} (the 100 sits on a hole): mean 2, sample std sqrt(10 / 3);
    # r~ = (1, -1, -2, 2) / s; row 0 sums r~ from t on; row 1: t=0 gets -2/s + 2/s = 0.
    s = (10.0 / 3.0) ** 0.5 + EPS
    expected = torch.tensor([[0.0, 0.0, -1 / s, -1 / s], [0.0, 0.0, 2 / s, 0.0], [0.0] * 4])
    assert torch.allclose(adv, expected, atol=1e-7)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as info:
        estimate("ppo", torch.zeros(1, 1), *[torch.ones(1, 1, dtype=torch.bool)] * 2)
    assert str(info.value) == f"unknown estimator 'ppo'; valid: {', '.join(sorted(ESTIMATORS))}"


@pytest.mark.parametrize("name", NAMES)
def test_requires_matches_behaviour_without_group_ids(name):
    rewards, reward_mask, response_mask, _ = make_batch(1)
    assert requires(name) == ({"group_ids"} if name in GROUPED else set())
    if name in GROUPED:
        for call in (estimate, lambda *a: ESTIMATORS[name](*a[1:])):
            with pytest.raises(ValueError, match=f"estimator '{name}' needs group_ids"):
                call(name, rewards, reward_mask, response_mask)
    else:
        estimate(name, rewards, reward_mask, response_mask)


BAD_INPUTS = [
    ("rewards", torch.zeros(3), r"rewards must be a floating-point tensor of shape \(B, T\); got"),
    ("rewards", torch.zeros(2, 3, dtype=torch.long), r"got dtype torch.int64, shape \(2, 3\)"),
    ("reward_mask", torch.ones(2, 3), r"bool .* = \(2, 3\); got dtype torch.float32.*mask.bool"),
    ("response_mask", torch.ones(2, 4, dtype=torch.bool), r"= \(2, 3\); got .* shape \(2, 4\)"),
    ("group_ids", torch.zeros(2, dtype=torch.int32), r"must be a long .* got dtype torch.int32"),
    ("group_ids", torch.zeros(3, dtype=torch.long), r"= \(2,\); got .* shape \(3,\)"),
    ("values", torch.zeros(2, 2), r"values must be a floating-point .* = \(2, 3\); got"),
    ("gamma", 1.5, r"gamma must lie in \[0, 1\]; got 1.5"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_INPUTS)
def test_bad_inputs_say_what_was_expected_and_received(key, value, message):
    args = {"rewards": torch.zeros(2, 3), "group_ids": torch.zeros(2, dtype=torch.long)}
    args |= dict.fromkeys(("reward_mask", "response_mask"), torch.ones(2, 3, dtype=torch.bool))
    args[key] = value
    with pytest.raises(ValueError, match=message):
        estimate("grpo", **args)


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match=r"rewards must be a torch\.Tensor; got list"):
        estimate("reinforce", [[0.0]], *[torch.ones(1, 1, dtype=torch.bool)] * 2)


def test_registration(monkeypatch):
    monkeypatch.setattr(registry, "ESTIMATORS", dict(registry.ESTIMATORS))
    monkeypatch.setattr(registry, "_NEEDS", dict(registry._NEEDS))
    original = registry.ESTIMATORS["grpo"]
    with pytest.raises(ValueError, match="estimator 'grpo' is already registered"):
        register_estimator("grpo")(lambda *a, **k: None)
    assert registry.ESTIMATORS["grpo"] is original

    @register_estimator("twice_reward", needs={"values"})
    def twice_reward(rewards, reward_mask, response_mask, *, group_ids=None, values=None, gamma=1.0, lam=1.0):
        return 2 * rewards, rewards

    assert registry.requires("twice_reward") == {"values"}
    masks = [torch.ones(1, 2, dtype=torch.bool)] * 2
    with pytest.raises(ValueError, match="estimator 'twice_reward' needs values"):
        registry.estimate("twice_reward", torch.ones(1, 2), *masks)
    with pytest.raises(ValueError, match="subset of"):
        register_estimator("bad", needs={"critic"})


def test_min_form_by_hand():
    # Two responses in one group, step rewards placed at the ends of their steps.
    rewards = torch.tensor([[0.0, 0.9, 0.0, 0.2, 0.8], [0.0, 0.6, 0.0, 0.0, 0.7]])
    reward_mask = torch.tensor([[0, 1, 0, 1, 1], [0, 1, 0, 0, 1]], dtype=torch.bool)
    response_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    adv, ret = estimate("min_form", rewards, reward_mask, response_mask, group_ids=torch.tensor([4, 4]))
    # Row 1's last reward sits on a masked token and is ignored: its rewards are 0.6 at t = 1 only.
    expected_ret = torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.8], [0.6, 0.6, 0.0, 0.0, 0.0]])
    assert torch.allclose(ret, expected_ret)
    # Baselines are the other response's minimum: 0.6 for row 0, 0.2 for row 1.
    expected_adv = torch.tensor([[-0.4, -0.4, -0.4, -0.4, 0.2], [0.4, 0.4, -0.2, -0.2, 0.0]])
    assert torch.allclose(adv, expected_adv)


@pytest.mark.parametrize("seed", range(6))
def test_min_form_is_rloo_for_sequence_rewards(seed):
    rewards, reward_mask, response_mask, group_ids = sequence_level(seed, n_groups=3, size=4)
    got = estimate("min_form", rewards, reward_mask, response_mask, group_ids=group_ids)
    want = estimate("rloo", rewards, reward_mask, response_mask, group_ids=group_ids)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_min_form_cannot_be_raised_by_adding_good_steps():
    # Sum-form credit pays for every extra step the reward model likes; min-form does not.
    short = torch.tensor([[0.0, 0.3, 0.0, 0.9]])
    padded = torch.tensor([[0.0, 0.3, 0.0, 0.9, 0.0, 0.9, 0.0, 0.9]])
    mask_s, mask_p = short != 0, padded != 0
    ones_s, ones_p = torch.ones_like(mask_s), torch.ones_like(mask_p)
    _, ret_s = estimate("min_form", short, mask_s, ones_s, group_ids=torch.tensor([0]))
    _, ret_p = estimate("min_form", padded, mask_p, ones_p, group_ids=torch.tensor([0]))
    assert ret_s[0, 0] == ret_p[0, 0] == pytest.approx(0.3)
    assert reward_to_go(padded, ones_p)[0, 0] > reward_to_go(short, ones_s)[0, 0]
