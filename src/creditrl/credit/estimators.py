"""Critic-free advantage estimators (REINFORCE, RLOO, the GRPO family) and their building blocks.

Index convention. For response b, time runs only over the positions where ``response_mask`` is
1. Write k(s) for the rank of valid position s among the valid positions of its row (0, 1, ...).
Masked positions (observation/tool tokens inside a response, trailing padding) are skipped: they
get no credit, do not advance the discount, and a reward placed on one is ignored.

    R_b     = sum_{valid s} rewards[b, s]                                (sequence return)
    G[b, t] = sum_{valid s >= t} gamma^(k(s) - k(t)) rewards[b, s]       (reward-to-go)

Group statistics run over the responses that share a ``group_ids`` value; std is the sample
standard deviation (n - 1) and ``EPS = 1e-6``. Every estimator has the signature of
``registry.EstimatorFn`` and returns ``(advantages, returns)``, float (B, T), exactly 0 where
``response_mask`` is 0, with ``returns = G``. ``reward_mask`` is read only by ``grpo_process``;
the others sum every reward on a valid token (shaping terms may sit on unplaced tokens).
"""

import torch
from torch import Tensor

from creditrl.credit.registry import missing_input_error, register_estimator

EPS = 1e-6


def compact(x: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Move each row's valid entries to the front, in order, so that column k holds rank k.

    x float (B, T), response_mask bool (B, T) -> (packed (B, T), order long (B, T)), where
    packed[b, k] = x[b, s] for the valid s with k(s) = k, and 0 for k >= (valid count of row b).
    ``order`` is the permutation applied; ``expand`` undoes it.
    """
    # A stable sort on "is masked" lists the valid positions first, keeping their order.
    order = torch.argsort((~response_mask).to(torch.uint8), dim=1, stable=True)
    packed = torch.where(response_mask, x, 0).gather(1, order)
    return packed, order


def expand(packed: Tensor, order: Tensor, response_mask: Tensor) -> Tensor:
    """Undo ``compact``: out[b, s] = packed[b, k(s)] on valid s and 0 on masked s, all (B, T)."""
    out = torch.zeros_like(packed).scatter_(1, order, packed)
    return torch.where(response_mask, out, 0)


BLOCK = 64  # columns per block of ``discounted_cumsum``: one (64, 64) matmul per block


def discounted_cumsum(x: Tensor, c: float | Tensor) -> Tensor:
    """y[:, t] = sum_{s >= t} c^(s - t) x[:, s] over plain columns (no mask); x, y (B, T).

    ``c`` is one decay for every row (a float) or one per row (a float (B,) tensor: row b decays by
    ``c[b]``, as a per-response lambda needs, see :func:`creditrl.credit.lambdas.length_adaptive_lam`).

    Equivalently ``y_t = x_t + c * y_{t+1}`` with ``y_T = 0``, for any decay c in [0, 1]: the
    discount gamma for a reward-to-go, gamma * lam for GAE. A blocked scan, with no Python loop
    over time: T is cut into blocks of n = min(T, BLOCK) columns; inside block j,

        y_j = x_j @ M + c^(n - i) * y[:, start of block j + 1]     (i = 0..n-1, column in block)

    with M[s, i] = c^(s - i) for s >= i (built in float64, so every entry is a correctly rounded
    power of c; one M per row for a per-row c). The block starts themselves obey
    ``Y_j = f_j + c^n * Y_{j+1}`` (f_j = first column of x_j @ M), a discounted cumsum with
    decay c^n over T / n columns, computed by the same function. Only non-negative powers of c
    appear, so it is stable for every c in [0, 1] (a closed form through c^-t overflows for long
    T), and it needs O(n^2) memory for M where a (T, T) discount matrix would need O(T^2).
    """
    per_row = isinstance(c, Tensor)
    rows, length = x.shape
    if length == 0 or (not per_row and c == 1.0):
        return x.flip(1).cumsum(1).flip(1)
    c64 = torch.as_tensor(c, dtype=torch.float64, device=x.device)  # () or (B,)
    n = min(length, BLOCK)
    blocks = -(-length // n)
    steps = torch.arange(n, device=x.device)
    gap = steps[:, None] - steps[None, :]  # (n, n): s - i
    # gap.clamp(min=0) keeps the exponent >= 0 (no c^-k), and torch.pow gives 0^0 = 1, so the
    # diagonal is 1 even for c = 0 (y = x).
    powers = torch.pow(c64[..., None, None], gap.clamp(min=0))
    matrix = torch.where(gap >= 0, powers, 0).to(x.dtype)  # (n, n), or (B, n, n) per row
    # Zero columns appended at the end add nothing to any earlier y_t.
    padded = torch.nn.functional.pad(x, (0, blocks * n - length))
    local = padded.view(rows, blocks, n) @ matrix  # (B, blocks, n)
    if blocks == 1:
        return local.view(rows, n)[:, :length]
    starts = discounted_cumsum(local[:, :, 0], c64**n if per_row else c**n)  # (B, blocks): Y_j
    carry = torch.nn.functional.pad(starts[:, 1:], (0, 1))  # (B, blocks): Y_{j+1}, 0 after last
    decay = torch.pow(c64[..., None], n - steps).to(x.dtype)  # (n,) or (B, n): c^(n - i)
    y = local + carry[:, :, None] * decay[..., None, :]  # (B, blocks, n)
    return y.view(rows, blocks * n)[:, :length]


def reward_to_go(rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """G[b, t] = sum_{valid s >= t} gamma^(k(s) - k(t)) rewards[b, s] on valid t, 0 on masked t.

    rewards float (B, T), response_mask bool (B, T) -> G float (B, T). k(s) is the rank of s
    among its row's valid positions, so masked positions neither earn nor break discounting.
    """
    if gamma == 1.0:
        # Undiscounted, skipping a masked position is the same as adding 0 there: no compaction.
        summed = discounted_cumsum(torch.where(response_mask, rewards, 0), 1.0)
        return torch.where(response_mask, summed, 0)
    packed, order = compact(rewards, response_mask)
    return expand(discounted_cumsum(packed, gamma), order, response_mask)


def sequence_return(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """R_b = sum_{valid s} rewards[b, s].

    rewards float (B, T), response_mask bool (B, T) -> R float (B,).
    """
    return torch.where(response_mask, rewards, 0).sum(1)


def _per_row(stat: Tensor, like: Tensor) -> Tensor:
    """View a (B,) statistic so that it broadcasts against ``like`` of shape (B,) or (B, T)."""
    return stat.unsqueeze(1) if like.dim() == 2 else stat


def group_sum(x: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> Tensor:
    """out[b] = sum of x[j, ...] over the responses j with group_ids[j] == group_ids[b].

    x (B,) or (B, T); mask bool of x's shape selects the entries that count (all when None);
    group_ids long (B,); out (B,), one total per response (equal within a group).
    """
    rows = x if mask is None else torch.where(mask, x, 0)
    rows = rows.sum(1) if rows.dim() == 2 else rows
    # Ids may be sparse and unsorted: map them to 0..n_groups-1 before index_add.
    groups, index = torch.unique(group_ids, return_inverse=True)
    totals = rows.new_zeros(groups.numel()).index_add_(0, index, rows)
    return totals[index]


def group_count(group_ids: Tensor, mask: Tensor | None = None) -> Tensor:
    """Number of responses in each response's group, or of selected entries when ``mask``
    (bool (B,) or (B, T)) is given; group_ids long (B,) -> long (B,)."""
    ones = torch.ones_like(group_ids) if mask is None else mask.long()
    return group_sum(ones, group_ids)


def group_mean(x: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean of the selected entries of x over each response's group (0 for an empty selection).

    x float (B,) or (B, T); mask bool of x's shape or None; group_ids long (B,) -> (B,).
    """
    n = group_count(group_ids, mask).clamp(min=1)
    first = group_sum(x, group_ids, mask) / n
    # Refine the mean once by its residual (the correction term of the corrected two-pass
    # algorithm, Chan, Golub & LeVeque, 1983): a group of equal values then gets that value
    # exactly, so zero spread gives x - mean = 0 rather than rounding noise that a later
    # division by (0 + EPS) would blow up (in float32, sum(7 x 0.3) / 7 != 0.3).
    return first + group_sum(x - _per_row(first, x), group_ids, mask) / n


def group_std(x: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> Tensor:
    """Sample standard deviation (n - 1) of the selected entries of x over each response's group;
    0 for a group with fewer than two selected entries.

    x float (B,) or (B, T); mask bool of x's shape or None; group_ids long (B,) -> (B,).
    """
    n = group_count(group_ids, mask)
    deviation = x - _per_row(group_mean(x, group_ids, mask), x)
    # With n < 2 the squared deviations sum to exactly 0; the clamp turns 0/0 into 0.
    return (group_sum(deviation * deviation, group_ids, mask) / (n - 1).clamp(min=1)).sqrt()


def leave_one_out_mean(x: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(mean of x over the *other* responses of each response's group, whether it has any);
    x float (B,), group_ids long (B,) -> (float (B,), bool (B,)); the mean is 0 for a lone response."""
    n = group_count(group_ids)
    return (group_sum(x, group_ids) - x) / (n - 1).clamp(min=1), n > 1


def require_groups(group_ids: Tensor | None, estimator: str) -> Tensor:
    if group_ids is None:
        raise missing_input_error(estimator, "group_ids")
    return group_ids


@register_estimator("reinforce")
def reinforce(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE without a baseline (Williams, 1992): ``A[b, t] = G[b, t]``, ``returns = G``.

    rewards float (B, T), masks bool (B, T) -> (advantages, returns) float (B, T).
    ``group_ids``, ``values`` and ``lam`` are unused.
    """
    g = reward_to_go(rewards, response_mask, gamma)
    # Separate tensors, so that editing advantages in place cannot silently change returns.
    return g.clone(), g


@register_estimator("reinforce_baseline", needs={"group_ids"})
def reinforce_baseline(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """Reward-to-go minus the group-mean return: ``A[b, t] = G[b, t] - mean_{j in group(b)} R_j``
    (b included, so a lone response gets G - R_b). Followed by the batch normaliser this is
    REINFORCE++-baseline (Hu, 2025, arXiv:2501.03262).

    rewards float (B, T), masks bool (B, T), group_ids long (B,) -> (advantages, returns) float
    (B, T); ``returns = G``. ``values`` and ``lam`` are unused.
    """
    groups = require_groups(group_ids, "reinforce_baseline")
    g = reward_to_go(rewards, response_mask, gamma)
    baseline = group_mean(sequence_return(rewards, response_mask), groups)  # (B,)
    return torch.where(response_mask, g - baseline[:, None], 0), g


@register_estimator("rloo", needs={"group_ids"})
def rloo(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out (Kool et al., 2019; Ahmadian et al., 2024, arXiv:2402.14740):
    ``A[b, t] = G[b, t] - mean_{j in group(b), j != b} R_j``; 0 for a group of size 1.

    With sequence-level rewards this is RLOO; with dense rewards it is reward-to-go with a
    leave-one-out baseline. rewards float (B, T), masks bool (B, T), group_ids long (B,) ->
    (advantages, returns) float (B, T); ``returns = G``. ``values`` and ``lam`` are unused.
    """
    groups = require_groups(group_ids, "rloo")
    g = reward_to_go(rewards, response_mask, gamma)
    baseline, shared = leave_one_out_mean(sequence_return(rewards, response_mask), groups)  # (B,)
    # A lone response has no other response to compare with.
    return torch.where(response_mask & shared[:, None], g - baseline[:, None], 0), g


@register_estimator("grpo", needs={"group_ids"})
def grpo(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """GRPO outcome supervision (Shao et al., 2024, DeepSeekMath, arXiv:2402.03300, sec. 4.1.2):
    ``A[b, t] = (R_b - mean_g R) / (std_g R + EPS)`` on every valid token.

    Dense rewards are summed into R_b first; gamma only shapes ``returns = G``. A group of size 1
    or with equal returns gets 0. rewards float (B, T), masks bool (B, T), group_ids long (B,) ->
    (advantages, returns) float (B, T). ``values`` and ``lam`` are unused.
    """
    groups = require_groups(group_ids, "grpo")
    r = sequence_return(rewards, response_mask)  # (B,)
    score = (r - group_mean(r, groups)) / (group_std(r, groups) + EPS)
    returns = reward_to_go(rewards, response_mask, gamma)
    return torch.where(response_mask, score[:, None], 0), returns


@register_estimator("dr_grpo", needs={"group_ids"})
def dr_grpo(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """Dr. GRPO (Liu et al., 2025, arXiv:2503.20783): ``A[b, t] = R_b - mean_g R`` on every valid
    token, GRPO without the std division that favours groups of low spread.

    rewards float (B, T), masks bool (B, T), group_ids long (B,) -> (advantages, returns) float
    (B, T); ``returns = G``. ``values`` and ``lam`` are unused.
    """
    groups = require_groups(group_ids, "dr_grpo")
    r = sequence_return(rewards, response_mask)  # (B,)
    score = r - group_mean(r, groups)
    returns = reward_to_go(rewards, response_mask, gamma)
    return torch.where(response_mask, score[:, None], 0), returns


@register_estimator("grpo_process", needs={"group_ids"})
def grpo_process(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """GRPO process supervision (Shao et al., 2024, DeepSeekMath, arXiv:2402.03300, sec. 4.1.3).

    Within a group, every placed reward on a valid token, P_g = {rewards[j, s] : reward_mask[j, s]
    and response_mask[j, s]}, is normalised, ``r~ = (r - mean(P_g)) / (std(P_g) + EPS)``, and a
    token's advantage is the sum of its own row's normalised rewards from t on (no discount):
    ``A[b, t] = sum_{valid s >= t, reward_mask[b, s]} r~[b, s]``. A group of one response or
    with fewer than two placed rewards gets 0. gamma does not enter A (the paper sums the
    normalised rewards undiscounted); it shapes ``returns = G`` only.

    rewards float (B, T), masks bool (B, T), group_ids long (B,) -> (advantages, returns) float
    (B, T). ``values`` and ``lam`` are unused.
    """
    groups = require_groups(group_ids, "grpo_process")
    placed = reward_mask & response_mask  # (B, T)
    mean = group_mean(rewards, groups, placed)[:, None]  # (B, 1)
    std = group_std(rewards, groups, placed)[:, None]  # (B, 1)
    # DESIGN: a lone response gets 0 even when it holds several placed rewards of its own.
    shared = (group_count(groups) > 1)[:, None]  # (B, 1)
    normalised = torch.where(placed & shared, (rewards - mean) / (std + EPS), 0)
    returns = reward_to_go(rewards, response_mask, gamma)
    return reward_to_go(normalised, response_mask, 1.0), returns
