"""The separate outcome term of the advantages (``creditrl.credit.outcome``): against a loop, and
PURE's PRM+VR identity with ``min_form``."""

import pytest
import torch

from creditrl.credit import estimate, outcome_advantage


def make_batch(seed):
    """Random masks with holes and empty rows, step rewards in [0, 1], 0/1 outcomes, groups of 1-4."""
    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 12, (), generator=gen))
    T = int(torch.randint(1, 15, (), generator=gen))
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    response_mask = (torch.arange(T) < lengths[:, None]) & (torch.rand(B, T, generator=gen) > 0.2)
    reward_mask = torch.rand(B, T, generator=gen) < 0.4
    rewards = torch.where(reward_mask, torch.rand(B, T, generator=gen, dtype=torch.float64), 0.0)
    outcome = (torch.rand(B, generator=gen) < 0.5).double()
    group_ids = torch.randint(0, 4, (B,), generator=gen) * 3
    return rewards, reward_mask, response_mask, outcome, group_ids


def loop_outcome_advantage(outcome, response_mask, group_ids):
    o, m, g = outcome.tolist(), response_mask.tolist(), group_ids.tolist()
    out = torch.zeros(response_mask.shape, dtype=torch.float64)
    for b in range(len(o)):
        others = [o[j] for j in range(len(o)) if g[j] == g[b] and j != b]
        for t in range(len(m[b])):
            if m[b][t] and others:
                out[b, t] = o[b] - sum(others) / len(others)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_outcome_advantage_matches_the_loop(seed):
    _, _, response_mask, outcome, group_ids = make_batch(seed)
    got = outcome_advantage(outcome, response_mask, group_ids)
    assert got.dtype == torch.float64
    assert torch.allclose(got, loop_outcome_advantage(outcome, response_mask, group_ids), atol=1e-12)


@pytest.mark.parametrize("w", [0.1, 1.0])
@pytest.mark.parametrize("seed", range(20))
def test_min_form_plus_the_outcome_term_is_pure_prm_plus_vr(seed, w):
    """PURE's PRM+VR: RLOO on the min-form return plus the weighted verifiable reward,
    ``A[b, t] = (M[b, t] + w o_b) - mean_{j != b} (M_j + w o_j)``, by a loop over Python floats."""
    rewards, reward_mask, response_mask, outcome, group_ids = make_batch(seed)
    adv, _ = estimate("min_form", rewards, reward_mask, response_mask, group_ids=group_ids)
    got = adv + w * outcome_advantage(outcome, response_mask, group_ids)
    r, pm, m = rewards.tolist(), (reward_mask & response_mask).tolist(), response_mask.tolist()
    o, g = outcome.tolist(), group_ids.tolist()
    B, T = rewards.shape

    def min_ahead(b, t):  # M[b, t]: the smallest placed reward at or after t (0 when none)
        ahead = [r[b][s] for s in range(t, T) if pm[b][s]]
        return min(ahead) if ahead else 0.0

    for b in range(B):
        others = [j for j in range(B) if g[j] == g[b] and j != b]
        baseline = sum(min_ahead(j, 0) + w * o[j] for j in others) / max(1, len(others))
        for t in range(T):
            want = min_ahead(b, t) + w * o[b] - baseline if m[b][t] and others else 0.0
            assert got[b, t].item() == pytest.approx(want, abs=1e-12)


def test_errors():
    _, _, response_mask, outcome, group_ids = make_batch(0)
    with pytest.raises(ValueError, match=r"outcome must be a floating-point tensor of shape \(B,\)"):
        outcome_advantage(outcome.long(), response_mask, group_ids)
    with pytest.raises(ValueError, match="response_mask must be a bool tensor"):
        outcome_advantage(outcome, response_mask.float(), group_ids)
    with pytest.raises(ValueError, match="group_ids must be a long"):
        outcome_advantage(outcome, response_mask, group_ids.int())
