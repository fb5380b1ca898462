"""The lambdas of long outputs (``creditrl.credit.lambdas``): VAPO's length-adaptive lambda and
VC-PPO's decoupled critic lambda, against slow per-token loops, by hand, and -- unset -- bit for
bit the tensors the credit stage gave before they existed (``tests/fixtures/credit``)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from creditrl.credit import discounted_cumsum, estimate, estimate_at, length_adaptive_lam
from creditrl.credit.estimators import BLOCK

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "credit"
GAMMA_LAM = [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (0.99, 0.95), (0.9, 0.5)]
ALPHAS = [0.05, 0.2, 1.0]


def _generate():
    spec = importlib.util.spec_from_file_location("credit_fixture_generate", FIXTURES / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loop_gae(rewards, response_mask, values, gamma, lams):
    """GAE per row over Python floats with row b's own lambda ``lams[b]``: walk the valid
    positions backwards, skipping holes; V after the last valid token is 0."""
    r, v, m = rewards.tolist(), values.tolist(), response_mask.tolist()
    B, T = rewards.shape
    adv, ret = [[0.0] * T for _ in range(B)], [[0.0] * T for _ in range(B)]
    for b in range(B):
        next_value, next_adv = 0.0, 0.0
        for t in reversed([t for t in range(T) if m[b][t]]):
            delta = r[b][t] + gamma * next_value - v[b][t]
            next_adv = delta + gamma * lams[b] * next_adv
            next_value = v[b][t]
            adv[b][t], ret[b][t] = next_adv, next_adv + v[b][t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def loop_lam(length, alpha):
    """VAPO's lambda for one response of ``length`` time steps, in Python floats."""
    return 0.0 if length == 0 else min(1.0, max(0.0, 1.0 - 1.0 / (alpha * length)))


def make_batch(seed, dtype=torch.float64, max_b=9, max_t=40):
    """Random B and T, trailing padding, holes, empty rows, rewards on a random subset of tokens,
    values everywhere, step ends anywhere."""
    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, max_b, (), generator=gen))
    T = int(torch.randint(1, max_t, (), generator=gen))
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    response_mask = (torch.arange(T) < lengths[:, None]) & (torch.rand(B, T, generator=gen) > 0.25)
    reward_mask = torch.rand(B, T, generator=gen) < 0.4
    rewards = torch.where(reward_mask, torch.randn(B, T, generator=gen), 0.0).to(dtype)
    values = torch.randn(B, T, generator=gen).to(dtype)
    step_ends = torch.rand(B, T, generator=gen) < 0.3
    return rewards, reward_mask, response_mask, values, step_ends


def loop_steps(step_ends, response_mask):
    """Each row's steps as lists of token positions (a step ends on a valid step end; the valid
    tokens after the last one form a final step)."""
    rows = []
    for ends, valid in zip(step_ends.tolist(), response_mask.tolist(), strict=True):
        steps, current = [], []
        for t, (end, ok) in enumerate(zip(ends, valid, strict=True)):
            if ok:
                current.append(t)
                if end:
                    steps.append(current)
                    current = []
        if current:
            steps.append(current)
        rows.append(steps)
    return rows


def close(a, b, dtype):
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    return torch.allclose(a.double(), b, atol=tol, rtol=tol)


# ------------------------------------------------------------------------- the per-row cumsum


@pytest.mark.parametrize("length", [1, 7, BLOCK, 2 * BLOCK + 37])
@pytest.mark.parametrize("seed", range(3))
def test_per_row_discounted_cumsum_matches_the_recursion(seed, length):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, length, generator=gen, dtype=torch.float64)
    c = torch.tensor([0.0, 1.0, 0.5, 0.95, 0.999], dtype=torch.float64)
    y = discounted_cumsum(x, c)
    for b in range(5):
        running, want = 0.0, [0.0] * length
        for t in range(length - 1, -1, -1):
            running = x[b, t].item() + c[b].item() * running
            want[t] = running
        assert torch.allclose(y[b], torch.tensor(want, dtype=torch.float64), atol=1e-10)
    # one decay for every row: the per-row scan agrees with the scalar one
    assert torch.allclose(discounted_cumsum(x, torch.full((5,), 0.9, dtype=torch.float64)), discounted_cumsum(x, 0.9))


# ------------------------------------------------------------------ VAPO's length-adaptive lambda


def test_length_adaptive_lam_by_hand():
    lam = length_adaptive_lam(torch.tensor([0, 10, 20, 40, 100, 1000]), 0.05)
    # 1 - 1/(0.05 l): l=10 -> -1 and l=20 -> 0 clamp to 0; l=40 -> 0.5, l=100 -> 0.8, l=1000 -> 0.98
    assert lam.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, 0.8, 0.98], abs=1e-12)
    assert lam.dtype == torch.float64
    with pytest.raises(ValueError, match="alpha must be > 0"):
        length_adaptive_lam(torch.tensor([3]), 0.0)
    with pytest.raises(ValueError, match="lengths must be a tensor of shape"):
        length_adaptive_lam(torch.tensor([[3]]), 0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAM)
@pytest.mark.parametrize("seed", range(8))
def test_length_adaptive_gae_matches_the_loop_at_token_resolution(seed, gamma, lam, alpha, dtype):
    rewards, reward_mask, response_mask, values, _ = make_batch(seed, dtype)
    adv, ret = estimate_at(
        "token", "gae", rewards, reward_mask, response_mask, values=values, gamma=gamma, lam=lam, lam_alpha=alpha
    )
    lams = [loop_lam(n, alpha) for n in response_mask.sum(1).tolist()]  # l_b = valid tokens
    ref_adv, _ = loop_gae(rewards, response_mask, values, gamma, lams)
    _, ref_ret = loop_gae(rewards, response_mask, values, gamma, [lam] * len(lams))  # returns keep credit.lam
    assert adv.dtype == ret.dtype == dtype
    assert close(adv, ref_adv, dtype) and close(ret, ref_ret, dtype)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAM)
@pytest.mark.parametrize("seed", range(8))
def test_length_adaptive_gae_counts_steps_at_step_resolution(seed, gamma, lam, alpha):
    rewards, reward_mask, response_mask, values, step_ends = make_batch(seed)
    adv, ret = estimate_at(
        "step",
        "gae",
        rewards,
        reward_mask,
        response_mask,
        step_ends=step_ends,
        values=values,
        gamma=gamma,
        lam=lam,
        lam_alpha=alpha,
        lam_critic=1.0,
    )
    r, v = rewards.tolist(), values.tolist()
    for b, row in enumerate(loop_steps(step_ends, response_mask)):
        lam_b = loop_lam(len(row), alpha)  # l_b = the row's steps
        step_r = [sum(r[b][t] for t in s) for s in row]
        step_v = [v[b][s[0]] for s in row]  # V(s_k): the value before the step's first token
        next_adv, next_ret, next_value = 0.0, 0.0, 0.0
        for k in reversed(range(len(row))):
            delta = step_r[k] + gamma * next_value - step_v[k]
            next_adv = delta + gamma * lam_b * next_adv
            next_ret = step_r[k] + gamma * next_ret  # lam_critic = 1: the discounted return
            next_value = step_v[k]
            for t in row[k]:
                assert adv[b, t].item() == pytest.approx(next_adv, abs=1e-10)
                assert ret[b, t].item() == pytest.approx(next_ret, abs=1e-10)
    assert (adv[~response_mask] == 0).all() and (ret[~response_mask] == 0).all()


def test_length_adaptive_lambda_by_hand():
    # One reward 1 on the last token of a 400-token and of a 10-token response, V = 0: A_t is
    # lam_b^(distance to the end). At alpha 0.05 the long row gets lam_b = 1 - 1/20 = 0.95 in place
    # of credit.lam = 0.5, the short one 1 - 1/0.5 < 0, clamped to 0 (the one-step TD error).
    T = 400
    response_mask = torch.zeros(2, T, dtype=torch.bool)
    response_mask[0], response_mask[1, :10] = True, True
    rewards = torch.zeros(2, T, dtype=torch.float64)
    rewards[0, T - 1], rewards[1, 9] = 1.0, 1.0
    values = torch.zeros(2, T, dtype=torch.float64)
    adv, ret = estimate_at("token", "gae", rewards, rewards != 0, response_mask, values=values, lam=0.5, lam_alpha=0.05)
    distance = torch.arange(T - 1, -1, -1, dtype=torch.float64)
    assert torch.allclose(adv[0], 0.95**distance, rtol=1e-9)
    assert adv[1, :9].abs().max().item() == 0.0 and adv[1, 9].item() == 1.0
    assert torch.allclose(ret[0], 0.5**distance, rtol=1e-9)  # the returns keep credit.lam (lam_critic null)


# ---------------------------------------------------------------------- VC-PPO's decoupled lambda


@pytest.mark.parametrize("resolution", ["token", "step"])
@pytest.mark.parametrize("lam_critic", [1.0, 0.0, 0.7])
@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAM)
@pytest.mark.parametrize("seed", range(6))
def test_decoupled_lambda_keeps_the_advantages_and_takes_the_returns_at_lam_critic(
    seed, gamma, lam, lam_critic, resolution
):
    rewards, reward_mask, response_mask, values, step_ends = make_batch(seed)
    tensors = (rewards, reward_mask, response_mask)
    call = {"step_ends": step_ends, "values": values, "gamma": gamma}
    adv, ret = estimate_at(resolution, "gae", *tensors, lam=lam, lam_critic=lam_critic, **call)
    policy_adv, _ = estimate_at(resolution, "gae", *tensors, lam=lam, **call)
    _, critic_ret = estimate_at(resolution, "gae", *tensors, lam=lam_critic, **call)
    assert torch.equal(adv, policy_adv) and torch.equal(ret, critic_ret)
    if resolution == "token":  # and against the loop
        ref_adv, _ = loop_gae(rewards, response_mask, values, gamma, [lam] * len(rewards))
        _, ref_ret = loop_gae(rewards, response_mask, values, gamma, [lam_critic] * len(rewards))
        assert close(adv, ref_adv, torch.float64) and close(ret, ref_ret, torch.float64)


@pytest.mark.parametrize("seed", range(6))
def test_lam_critic_one_gives_the_monte_carlo_return(seed):
    rewards, reward_mask, response_mask, values, _ = make_batch(seed)
    _, ret = estimate_at("token", "gae", rewards, reward_mask, response_mask, values=values, lam=0.95, lam_critic=1.0)
    _, g = estimate("reinforce", rewards, reward_mask, response_mask)  # G, the reward-to-go
    assert torch.allclose(ret, g, atol=1e-10)


def test_returns_lambda_equal_to_lam_runs_once(monkeypatch):
    import creditrl.credit.resolution as resolution

    calls = []
    real = resolution.estimate
    monkeypatch.setattr(resolution, "estimate", lambda *a, **k: calls.append(k["lam"]) or real(*a, **k))
    rewards, reward_mask, response_mask, values, _ = make_batch(0)
    for lam_critic in (None, 0.95):
        estimate_at("token", "gae", rewards, reward_mask, response_mask, values=values, lam=0.95, lam_critic=lam_critic)
    assert calls == [0.95, 0.95]
    estimate_at("token", "gae", rewards, reward_mask, response_mask, values=values, lam=0.95, lam_critic=1.0)
    assert calls[2:] == [0.95, 1.0]


# --------------------------------------------------------------------- unset: exactly as before


def test_unset_lambdas_give_the_tensors_of_before_bit_for_bit():
    """Every estimator x resolution x (gamma, lam) of ``tests/fixtures/credit/generate.py``, run
    with ``lam_alpha = 0`` and ``lam_critic`` None, against the digests written before these
    options existed (on another CPU kind, whose kernels may round differently: sums to 1e-12)."""
    generate = _generate()
    fixture = json.loads((FIXTURES / "estimates.json").read_text())
    got = generate.estimates()  # the generator's own call, as it ran then
    assert sorted(got) == sorted(fixture["estimates"])
    same_cpu = fixture["cpu"] == torch.backends.cpu.get_cpu_capability()
    for key, want in fixture["estimates"].items():
        x = got[key]
        if same_cpu:
            assert generate.digest(x) == want["sha256"], key
        else:
            assert float(x.sum()) == pytest.approx(want["sum"], rel=1e-12, abs=1e-12), key
            assert float(x.abs().sum()) == pytest.approx(want["abs_sum"], rel=1e-12, abs=1e-12), key
    # and passing the defaults explicitly changes nothing
    x = generate.inputs(0)
    args = (x["rewards"], x["reward_mask"], x["response_mask"])
    kw = {"step_ends": x["step_ends"], "group_ids": x["group_ids"], "values": x["values"], "gamma": 0.99, "lam": 0.95}
    for resolution in ("token", "step"):
        plain = estimate_at(resolution, "gae", *args, **kw)
        explicit = estimate_at(resolution, "gae", *args, **kw, lam_alpha=0.0, lam_critic=None)
        assert all(torch.equal(a, b) for a, b in zip(plain, explicit, strict=True))


# ------------------------------------------------------------------------------------ errors


def test_errors():
    rewards, reward_mask, response_mask, values, _ = make_batch(1)
    B = len(rewards)
    call = {"values": values}
    with pytest.raises(ValueError, match="lam_alpha must be >= 0"):
        estimate_at("token", "gae", rewards, reward_mask, response_mask, lam_alpha=-0.1, **call)
    with pytest.raises(ValueError, match=r"lam must lie in \[0, 1\]"):
        estimate_at("token", "gae", rewards, reward_mask, response_mask, lam_critic=1.5, **call)
    with pytest.raises(ValueError, match=r"per-response lam must be a floating-point tensor of shape \(B,\)"):
        estimate("gae", rewards, reward_mask, response_mask, lam=torch.ones(B + 1), **call)
    with pytest.raises(ValueError, match=r"per-response lam must be a floating-point tensor"):
        estimate("gae", rewards, reward_mask, response_mask, lam=torch.ones(B, dtype=torch.long), **call)
    with pytest.raises(ValueError, match=r"lam must lie in \[0, 1\]; got entries from"):
        estimate("gae", rewards, reward_mask, response_mask, lam=torch.full((B,), 1.5), **call)


def test_credit_lengths_count_tokens_or_steps():
    from creditrl.credit import credit_lengths

    rewards, _, response_mask, _, step_ends = make_batch(3)
    assert credit_lengths("token", response_mask).tolist() == response_mask.sum(1).tolist()
    assert credit_lengths("step", response_mask, step_ends).tolist() == [
        len(row) for row in loop_steps(step_ends, response_mask)
    ]
    with pytest.raises(ValueError, match="resolution 'step' needs step_ends"):
        credit_lengths("step", response_mask)
