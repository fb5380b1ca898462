"""Property tests: no input makes an estimator, normaliser or aggregation return NaN or inf.

Inputs cover B = 1 and T = 1, all-masked rows, groups of one response, groups with equal
returns (zero spread), and magnitudes from subnormal to |x| = 1e6 in float32.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from creditrl.credit import ESTIMATORS, NORMALISERS, estimate, estimate_at, normalise, requires
from creditrl.losses import AGGREGATIONS, aggregate

# database=None: no example database written into the working tree.
FAST = settings(max_examples=60, deadline=None, database=None)

# Exact extremes, small and large magnitudes, plus ordinary floats up to 1e6.
SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-30, -1e-38, 1e-45, 1e6, -1e6, 0.1, 0.3])
FLOATS = st.one_of(SPECIAL, st.floats(-1e6, 1e6, allow_nan=False, width=32))


@st.composite
def batches(draw):
    """(rewards, reward_mask, response_mask, group_ids, values, step_ends), float32 (B, T)."""
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 7))
    matrix = st.lists(st.lists(FLOATS, min_size=T, max_size=T), min_size=B, max_size=B)
    flags = st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)
    rewards = torch.tensor(draw(matrix), dtype=torch.float32)
    values = torch.tensor(draw(matrix), dtype=torch.float32)
    reward_mask = torch.tensor(draw(flags), dtype=torch.bool)
    response_mask = torch.tensor(draw(flags), dtype=torch.bool)
    step_ends = torch.tensor(draw(flags), dtype=torch.bool)
    if draw(st.booleans()):  # a row with nothing valid
        response_mask[draw(st.integers(0, B - 1))] = False
    if draw(st.booleans()):  # equal rewards everywhere: every group has zero spread
        rewards = torch.full_like(rewards, draw(FLOATS))
    # Few distinct ids: groups of one response and groups of several both occur.
    group_ids = torch.tensor(draw(st.lists(st.integers(-2, 2), min_size=B, max_size=B)))
    return rewards, reward_mask, response_mask, group_ids, values, step_ends


GAMMAS = st.sampled_from([0.0, 0.5, 0.95, 0.99, 1.0])


def assert_clean(out, response_mask):
    assert torch.isfinite(out).all(), out
    assert (out[~response_mask] == 0).all(), out


def options(name, group_ids, values, gamma, lam):
    """Give an estimator the optional inputs it needs (and group_ids even when it does not)."""
    return {
        "group_ids": group_ids,
        "values": values if "values" in requires(name) else None,
        "gamma": gamma,
        "lam": lam,
    }


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@FAST
@given(batch=batches(), gamma=GAMMAS, lam=GAMMAS)
def test_estimators_are_finite_and_zero_on_masked_tokens(name, batch, gamma, lam):
    rewards, reward_mask, response_mask, group_ids, values, _ = batch
    call = options(name, group_ids, values, gamma, lam)
    for out in estimate(name, rewards, reward_mask, response_mask, **call):
        assert_clean(out, response_mask)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@settings(max_examples=30, deadline=None, database=None)
@given(batch=batches(), gamma=GAMMAS, lam=GAMMAS)
def test_step_resolution_is_finite_and_zero_on_masked_tokens(name, batch, gamma, lam):
    rewards, reward_mask, response_mask, group_ids, values, step_ends = batch
    call = options(name, group_ids, values, gamma, lam)
    for out in estimate_at("step", name, rewards, reward_mask, response_mask, step_ends=step_ends, **call):
        assert_clean(out, response_mask)


@pytest.mark.parametrize("name", sorted(NORMALISERS))
@FAST
@given(batch=batches())
def test_normalisers_are_finite_and_zero_on_masked_tokens(name, batch):
    advantages, _, response_mask, group_ids, _, _ = batch
    assert_clean(normalise(name, advantages, response_mask, group_ids=group_ids), response_mask)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
@FAST
@given(batch=batches(), norm=st.one_of(st.none(), st.floats(1.0, 4096.0)))
def test_aggregations_are_finite(name, batch, norm):
    loss, _, mask, _, _, _ = batch
    out = aggregate(name, loss, mask, norm=norm)
    assert out.dim() == 0 and math.isfinite(out.item())
    # Masked entries may hold anything: the result cannot see them.
    assert aggregate(name, torch.where(mask, loss, 1e30), mask, norm=norm).item() == out.item()
