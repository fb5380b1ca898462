"""Loss aggregation modes, the PPO clipped surrogate and the KL estimators vs slow references."""

import math

import pytest
import torch

from creditrl.losses import AGGREGATIONS, KL_ESTIMATORS, aggregate, kl_estimate, ppo_clip_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]])
MASK = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)  # last row empty


def random_case(seed, b=6, t=7):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[0] = False  # always one all-masked row
    mask[1] = True  # and one full row
    return loss, mask


def slow_aggregate(name, loss, mask, norm=None):
    rows = [[x for x, m in zip(lr, mr) if m] for lr, mr in zip(loss.tolist(), mask.tolist())]
    if name == "token-mean":
        flat = [x for r in rows for x in r]
        return sum(flat) / len(flat) if flat else 0.0
    if name == "seq-mean-token-mean":
        means = [sum(r) / len(r) for r in rows if r]
        return sum(means) / len(means) if means else 0.0
    if name == "seq-mean-token-sum-norm":
        c = norm if norm is not None else loss.shape[1]
        return sum(sum(r) / c for r in rows) / len(rows)
    raise AssertionError(name)


# ----------------------------------------------------------------------------- aggregate


def test_aggregation_modes_by_hand():
    assert aggregate("token-mean", LOSS, MASK).item() == pytest.approx((1 + 2 + 5 + 7 + 8) / 5)
    # per row: 1.5 and 20/3; the all-masked row does not count
    assert aggregate("seq-mean-token-mean", LOSS, MASK).item() == pytest.approx((1.5 + 20 / 3) / 2)
    # row sums 3, 20, 0 over the padded length T=4, mean over all 3 rows
    assert aggregate("seq-mean-token-sum-norm", LOSS, MASK).item() == pytest.approx((3 / 4 + 20 / 4 + 0) / 3)
    assert aggregate("seq-mean-token-sum-norm", LOSS, MASK, norm=10.0).item() == pytest.approx((0.3 + 2.0) / 3)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "name, norm",
    [
        ("token-mean", None),
        ("seq-mean-token-mean", None),
        ("seq-mean-token-sum-norm", None),
        ("seq-mean-token-sum-norm", 3.0),
    ],
)
def test_aggregation_matches_slow_loop(name, norm, seed):
    loss, mask = random_case(seed)
    got = aggregate(name, loss, mask, norm=norm).item()
    assert got == pytest.approx(slow_aggregate(name, loss, mask, norm), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_masked_entries_never_affect_the_result(name):
    loss, mask = random_case(11)
    huge = loss.clone().masked_fill(~mask, 1e30)
    zero = loss.clone().masked_fill(~mask, 0.0)
    assert aggregate(name, huge, mask).item() == aggregate(name, zero, mask).item()
    # and no gradient flows into masked entries
    x = huge.clone().requires_grad_(True)
    aggregate(name, x, mask).backward()
    assert float(x.grad[~mask].abs().sum()) == 0.0
    assert (x.grad[mask] != 0).all()


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_fully_masked_batch_gives_zero(name):
    out = aggregate(name, torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert out.item() == 0.0 and not math.isnan(out.item())


def test_aggregate_errors():
    with pytest.raises(
        ValueError,
        match="unknown loss aggregation 'sum'; valid: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean",
    ):
        aggregate("sum", LOSS, MASK)
    with pytest.raises(ValueError, match=r"loss \(3, 4\) and bool mask \(3, 3\)"):
        aggregate("token-mean", LOSS, MASK[:, :3])
    with pytest.raises(ValueError, match="must match"):
        aggregate("token-mean", LOSS, MASK.float())


# ----------------------------------------------------------------------------- ppo_clip_loss


def slow_ppo(logp, old, adv, mask, eps, eps_high=None, dual=None):
    """Per-token loop: loss = -min(r*A, clip(r)*A), dual-clipped at -c*A for A < 0."""
    hi = eps if eps_high is None else eps_high
    out = []
    for lp_r, old_r, a_r, m_r in zip(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist()):
        row = []
        for lp, o, a, m in zip(lp_r, old_r, a_r, m_r):
            if not m:
                row.append(0.0)
                continue
            r = math.exp(lp - o)
            obj = min(r * a, min(max(r, 1 - eps), 1 + hi) * a)
            loss = -obj
            if dual is not None and a < 0:
                loss = min(loss, -a * dual)
            row.append(loss)
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


def ppo_case(seed, b=5, t=8):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.6  # ratios ~ 0.2 .. 5
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.8
    return logp, old, adv, mask


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "kwargs",
    [
        {"clip_eps": 0.2},
        {"clip_eps": 0.1},
        {"clip_eps": 0.2, "clip_eps_high": 0.28},
        {"clip_eps": 0.2, "dual_clip": 3.0},
        {"clip_eps": 0.2, "clip_eps_high": 0.3, "dual_clip": 2.0},
    ],
)
def test_ppo_matches_slow_reference(kwargs, seed):
    logp, old, adv, mask = ppo_case(seed)
    loss, stats = ppo_clip_loss(logp, old, adv, mask, **kwargs)
    ref = slow_ppo(logp, old, adv, mask, kwargs["clip_eps"], kwargs.get("clip_eps_high"), kwargs.get("dual_clip"))
    assert torch.allclose(loss, ref, atol=1e-12)
    ratio = torch.exp(logp - old)
    assert stats.ratio_max == pytest.approx(float(ratio[mask].max()))
    lr = (logp - old)[mask]
    assert stats.approx_kl == pytest.approx(float((torch.exp(-lr) - 1 + lr).mean()))


def hand_case():
    # token:            0     1     2     3     4     5(masked)  6
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.1, 3.0, 1.3]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 1]], dtype=torch.bool)
    old = torch.full_like(ratio, -1.0)
    return old + torch.log(ratio), old, adv, mask


def test_clipfrac_and_gradients_by_hand():
    logp, old, adv, mask = hand_case()
    logp = logp.clone().requires_grad_(True)
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2)
    # clipped: token 0 (A>0, r>1.2) and token 2 (A<0, r<0.8); 6 valid tokens
    assert stats.clipfrac == pytest.approx(2 / 6)
    assert loss.detach().tolist()[0] == pytest.approx([-1.2, -0.5, 0.8, 1.5, -1.1, 0.0, 0.0])
    assert stats.ratio_max == pytest.approx(1.5)  # the masked ratio 3.0 is ignored
    loss.sum().backward()
    grad = logp.grad[0].tolist()
    # d(-A*r)/dlogp = -A*r on unclipped tokens; clipped and masked tokens get none
    assert grad == pytest.approx([0.0, -0.5, 0.0, 1.5, -1.1, 0.0, 0.0])


def test_asymmetric_high_clip():
    logp, old, adv, mask = hand_case()
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.6)
    # token 0 (r=1.5 < 1.6) is no longer clipped; token 2 still is (low side unchanged)
    assert stats.clipfrac == pytest.approx(1 / 6)
    assert loss[0, 0].item() == pytest.approx(-1.5)
    assert loss[0, 2].item() == pytest.approx(0.8)


def test_dual_clip_bounds_negative_advantage_loss():
    ratio = torch.tensor([[5.0, 2.0, 5.0, 0.5]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0, 1.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    old = torch.zeros_like(ratio)
    logp = torch.log(ratio).requires_grad_(True)
    loss, _ = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2, dual_clip=3.0)
    # A=-1, r=5: max(5, 1.2) = 5 -> bounded at 3; A=-1, r=2: 2 < 3 kept; A>0: untouched (-1.2)
    # A=-2, r=0.5: max(1.0, 1.6) = 1.6 < 6 kept
    assert loss.detach().tolist()[0] == pytest.approx([3.0, 2.0, -1.2, 1.6])
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 2.0, 0.0, 0.0])
    undual, _ = ppo_clip_loss(logp.detach(), old, adv, mask, clip_eps=0.2)
    assert undual[0, 0].item() == pytest.approx(5.0)


def test_ppo_masked_tokens_are_inert():
    logp, old, adv, mask = ppo_case(3)
    loss_a, stats_a = ppo_clip_loss(logp, old, adv, mask)
    g = torch.Generator().manual_seed(1)
    junk = lambda x: torch.where(mask, x, torch.randn(x.shape, generator=g, dtype=x.dtype) * 50)  # noqa: E731
    loss_b, stats_b = ppo_clip_loss(junk(logp), junk(old), junk(adv), mask)
    assert torch.equal(loss_a, loss_b)
    assert float(loss_a[~mask].abs().sum()) == 0.0
    assert (stats_a.clipfrac, stats_a.approx_kl, stats_a.ratio_max) == (
        stats_b.clipfrac,
        stats_b.approx_kl,
        stats_b.ratio_max,
    )


def test_on_policy_loss_is_minus_advantage():
    logp, _, adv, mask = ppo_case(0)
    loss, stats = ppo_clip_loss(logp, logp.clone(), adv, mask)
    assert torch.allclose(loss, (-adv).masked_fill(~mask, 0.0))
    assert stats.clipfrac == 0.0 and stats.approx_kl == 0.0 and stats.ratio_max == 1.0


# ----------------------------------------------------------------------------- KL


def test_kl_formulas_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-2.0, -1.0, -0.5]])
    lr = [1.0, -1.0, 0.0]
    assert kl_estimate(logp, ref, "k1").tolist()[0] == pytest.approx(lr)
    assert kl_estimate(logp, ref, "k2").tolist()[0] == pytest.approx([0.5, 0.5, 0.0])
    assert kl_estimate(logp, ref, "k3").tolist()[0] == pytest.approx([math.exp(-x) - 1 + x for x in lr])
    assert kl_estimate(logp, ref).tolist() == kl_estimate(logp, ref, "k3").tolist()  # k3 is the default
    assert KL_ESTIMATORS == ("k1", "k2", "k3")


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; valid: k1, k2, k3"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


def test_k3_is_non_negative_and_finite_even_far_off_policy():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 32, generator=g) * 20
    ref = torch.randn(64, 32, generator=g) * 20
    k3 = kl_estimate(logp, ref, "k3")
    assert torch.isfinite(k3).all()
    assert (k3 >= 0).all()
    assert (kl_estimate(logp, ref, "k2") >= 0).all()


def test_k1_and_k3_are_unbiased_for_the_true_kl():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    n = 200_000
    x = torch.multinomial(p, n, replacement=True, generator=g)
    logp, ref = p.log()[x], q.log()[x]
    for kind in ("k1", "k3"):
        est = kl_estimate(logp, ref, kind)
        se = float(est.std()) / math.sqrt(n)
        assert abs(float(est.mean()) - true_kl) < 5 * se, kind
    # k3 has the lower variance of the two unbiased ones (the reason GRPO uses it)
    assert kl_estimate(logp, ref, "k3").var() < kl_estimate(logp, ref, "k1").var()
