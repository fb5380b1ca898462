"""Micro-batched gradient accumulation in the update equals one step over the whole minibatch."""

import copy

import pytest
import torch

from creditrl.config import load_config
from creditrl.losses import AGGREGATIONS, aggregate, aggregation_count
from creditrl.policy.engines import HFEngine, SamplingParams
from creditrl.policy.model import build_tiny
from creditrl.rollout.batch import batch_from_generation, micro_batches
from creditrl.train.update import CriticTarget, update
from creditrl.values.critic import build_critic


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_chunk_counts_recombine_the_aggregate(name):
    """Each chunk's aggregate weighted by its share of the aggregation's count (as the update
    weights micro-batches and ranks) sums to the aggregate over all rows."""
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(9, 7, generator=g)
    mask = torch.rand(9, 7, generator=g) > 0.4
    mask[3] = False  # a response without a valid token
    chunks = [torch.tensor([0, 1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6, 7, 8])]
    whole = aggregate(name, loss, mask, norm=7.0)
    total = aggregation_count(name, mask)
    full = sum(aggregation_count(name, mask[c]) / total * aggregate(name, loss[c], mask[c], norm=7.0) for c in chunks)
    assert float(full) == pytest.approx(float(whole), rel=1e-6)
    with pytest.raises(ValueError, match="unknown loss aggregation 'nope'"):
        aggregation_count("nope", mask)


def _batch(model, tok, seed=0):
    prompts = [
        [tok.bos_token_id, *tok.encode(s, add_special_tokens=False)] for s in ["7+3=", "12*4-5=", "1=", "99-3*2="]
    ]
    gen = HFEngine(model, eos_id=tok.encode("#", add_special_tokens=False)[0], pad_id=tok.pad_token_id).generate(
        prompts, 3, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(seed)
    )
    return batch_from_generation(gen, gen.prompt_index, tok.pad_token_id)


def _width(batch, rows) -> int:
    return int(batch.prompt_mask[rows].sum(-1).max()) + int(batch.response_lengths[rows].max())


def test_micro_batches_keep_groups_whole_where_they_fit_and_respect_the_budget():
    model, tok = build_tiny(0)
    batch = _batch(model, tok)
    rows = torch.randperm(batch.size, generator=torch.Generator().manual_seed(1))
    micro = micro_batches(batch, rows, 60)
    assert sorted(torch.cat(micro).tolist()) == sorted(rows.tolist())
    assert max(3 * _width(batch, batch.group_ids == g) for g in range(4)) <= 60  # every group fits
    for m in micro:
        groups = set(batch.group_ids[m].tolist())
        assert all(int((batch.group_ids[rows] == g).sum()) == int((batch.group_ids[m] == g).sum()) for g in groups)
        assert len(m) * _width(batch, m) <= 60
    assert len(micro) > 1
    assert micro_batches(batch, rows, 0)[0].tolist() == rows.tolist()


def test_a_group_wider_than_the_budget_splits_by_rows():
    model, tok = build_tiny(0)
    batch = _batch(model, tok)
    rows = torch.arange(batch.size)
    budget = 24
    wide = [g for g in range(4) if 3 * _width(batch, batch.group_ids == g) > budget]
    assert wide  # the case has groups that cannot stay whole
    micro = micro_batches(batch, rows, budget)
    assert sorted(torch.cat(micro).tolist()) == rows.tolist()  # every row exactly once
    for m in micro:
        assert len(m) * _width(batch, m) <= budget or len(m) == 1
    for g in wide:  # a wide group's rows land in more than one micro-batch
        assert sum(bool((batch.group_ids[m] == g).any()) for m in micro) > 1
    assert [len(m) for m in micro_batches(batch, rows, 1)] == [1] * batch.size  # no row fits: one row each


def test_chunked_log_probs_equal_one_pass_and_are_zero_at_padding():
    from creditrl.rollout.batch import chunked_response_logprobs, response_logprobs

    model, tok = build_tiny(0)
    model.eval()
    batch = _batch(model, tok)
    with torch.no_grad():
        whole = response_logprobs(model, batch, packed=False)
        for budget in (0, 24, 60):
            for packed in (True, False):
                got = chunked_response_logprobs(model, batch, budget, packed=packed)
                assert torch.allclose(got[batch.response_mask], whole[batch.response_mask], atol=1e-5)
                assert bool((got[~batch.response_mask] == 0).all())


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
@pytest.mark.parametrize("critic_model", ["none", "separate", "shared"])
def test_micro_batched_update_equals_whole_minibatch(aggregation, critic_model):
    model, tok = build_tiny(0)
    batch = _batch(model, tok)
    g = torch.Generator().manual_seed(2)
    adv = torch.randn(batch.response_mask.shape, generator=g)
    ref = batch.old_logprobs + 0.1 * torch.randn(batch.response_mask.shape, generator=g)
    results = []
    for positions in (0, 40, 15):  # 15: every group is wider, so its rows split
        cfg = load_config(
            None,
            {
                "loss": {"aggregation": aggregation, "kl_coef": 0.1, "entropy_coef": 0.01},
                "optim": {"micro_batch_positions": positions, "minibatches": 2},
            },
        )
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        target = None
        if critic_model != "none":
            critic = build_critic(m, placement=critic_model, members=2, seed=0)
            copt = torch.optim.SGD(critic.parameters(), lr=1.0)
            returns = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(3))
            target = CriticTarget(critic, copt, returns, torch.zeros(2, *batch.response_mask.shape))
        logs = update(
            m,
            opt,
            batch,
            adv,
            batch.response_mask,
            cfg,
            torch.Generator().manual_seed(4),
            ref_logprobs=ref,
            critic=target,
        )
        params = torch.cat([p.detach().flatten() for p in m.parameters()])
        if target is not None:
            params = torch.cat([params, *[p.detach().flatten() for p in target.critic.parameters()]])
        results.append((params, logs))
    (p0, l0), (p1, l1), (p2, l2) = results
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert float((p0[: before.numel()] - before).abs().max()) > 1e-4  # the step moved the weights
    for p, logs in ((p1, l1), (p2, l2)):
        assert torch.allclose(p0, p, atol=2e-6, rtol=1e-4)
        for key in ("loss/total", "grad/norm", "kl/ref", "policy/entropy"):
            assert logs[key] == pytest.approx(l0[key], rel=1e-4, abs=1e-6)


def test_make_optimizer_follows_the_config() -> None:
    from creditrl.train.optim import make_optimizer

    cfg = load_config(
        overrides=["optim.lr=0.1", "optim.beta1=0.8", "optim.beta2=0.95", "optim.eps=1e-3", "optim.weight_decay=0.01"]
    )
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = make_optimizer([w], cfg.optim)
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.AdamW)
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (0.1, (0.8, 0.95), 1e-3, 0.01)
    # a larger eps shrinks a tiny gradient's first step: lr * g / (|g| + eps) after bias correction
    w.grad = torch.tensor([1e-3, 1.0])
    before = w.detach().clone()
    opt.step()
    decayed = before * (1 - 0.1 * 0.01)
    expected = decayed - 0.1 * w.grad / (w.grad.abs() + 1e-3)
    assert torch.allclose(w.detach(), expected, atol=1e-6)

    sgd = load_config(overrides=["optim.name=sgd", "optim.lr=0.5", "optim.momentum=0.9"])
    v = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = make_optimizer([v], sgd.optim)
    assert isinstance(opt, torch.optim.SGD)
    g = torch.tensor([0.2, -0.4])
    v.grad = g.clone()
    opt.step()  # momentum buffer starts at g
    assert torch.allclose(v.detach(), torch.tensor([1.0, -2.0]) - 0.5 * g)
    v.grad = g.clone()
    opt.step()  # buffer 0.9 g + g
    assert torch.allclose(v.detach(), torch.tensor([1.0, -2.0]) - 0.5 * g - 0.5 * 1.9 * g, atol=1e-7)


def _params(m) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in m.parameters()])


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_skipping_zero_advantage_rows_gives_the_same_step(aggregation):
    model, tok = build_tiny(0)
    batch = _batch(model, tok)  # 4 prompts x 3 samples
    adv = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(5))
    zero = (batch.group_ids == 1) | (batch.group_ids == 3)  # two whole groups, as GRPO gives all-failed groups
    zero[0] = True  # and one row of another group
    adv[zero] = 0.0
    adv[~zero, 0] = torch.where(adv[~zero, 0] == 0, 1.0, adv[~zero, 0])  # every other row has a non-zero token
    runs = {}
    for skip in (False, True):
        cfg = load_config(
            None,
            {
                "loss": {"aggregation": aggregation},
                "optim": {"skip_zero_advantage": skip, "minibatches": 2, "ppo_epochs": 2, "micro_batch_positions": 40},
            },
        )
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        logs = update(m, opt, batch, adv, batch.response_mask, cfg, torch.Generator().manual_seed(4))
        runs[skip] = (_params(m), logs)
    (p0, l0), (p1, l1) = runs[False], runs[True]
    assert float((p0 - _params(model)).abs().max()) > 1e-4
    assert torch.allclose(p0, p1, atol=1e-6, rtol=1e-5)
    for key in ("loss/total", "loss/policy", "grad/norm"):
        assert l1[key] == pytest.approx(l0[key], rel=1e-4, abs=1e-7)
    assert "update/skipped_rows" not in l0
    # each epoch's two minibatches of 6 rows hold the 7 zero rows between them: 7 / 12 on average
    assert l1["update/skipped_rows"] == pytest.approx(7 / 12)


def test_skipped_rows_leave_the_diagnostics_of_the_trained_rows():
    model, tok = build_tiny(0)
    batch = _batch(model, tok)
    adv = torch.zeros(batch.response_mask.shape)
    kept = batch.group_ids == 2
    adv[kept] = 1.0
    cfg = load_config(None, {"optim": {"micro_batch_positions": 0}})
    logs = update(
        copy.deepcopy(model),
        torch.optim.SGD(model.parameters(), lr=0.0),
        batch,
        adv,
        batch.response_mask,
        cfg,
        torch.Generator().manual_seed(0),
    )
    sub = batch.select(torch.nonzero(kept).flatten())
    ref = update(
        copy.deepcopy(model),
        torch.optim.SGD(model.parameters(), lr=0.0),
        sub,
        adv[kept],
        sub.response_mask,
        load_config(None, {"optim": {"skip_zero_advantage": False, "micro_batch_positions": 0}}),
        torch.Generator().manual_seed(0),
    )
    assert logs["update/skipped_rows"] == pytest.approx(9 / 12)
    assert logs["policy/entropy"] == pytest.approx(ref["policy/entropy"], rel=1e-5)
    assert logs["policy/clipfrac"] == ref["policy/clipfrac"] == 0.0


@pytest.mark.parametrize("overrides", [{}, {"loss": {"entropy_coef": 0.01}}])
def test_an_all_zero_advantage_step_is_still_a_zero_gradient_step(overrides):
    """AdamW keeps moving on its momentum (and weight decay) at a zero gradient: skipping every
    row must not turn that step into no step. With an entropy bonus nothing is skipped."""
    model, tok = build_tiny(0)
    batch = _batch(model, tok)
    first = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(1))
    runs = {}
    for skip in (False, True):
        cfg = load_config(None, {**overrides, "optim": {"skip_zero_advantage": skip}})
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
        update(m, opt, batch, first, batch.response_mask, cfg, torch.Generator().manual_seed(0))
        after_first = _params(m)
        logs = update(
            m, opt, batch, torch.zeros_like(first), batch.response_mask, cfg, torch.Generator().manual_seed(0)
        )
        runs[skip] = (_params(m), logs)
        assert float((runs[skip][0] - after_first).abs().max()) > 1e-5  # momentum moved it
    assert torch.allclose(runs[False][0], runs[True][0], atol=1e-7)
    assert runs[True][1].get("update/skipped_rows") == (None if overrides else 1.0)


def test_kl_rows_are_skipped_only_when_the_approximation_is_asked_for():
    """With a KL term a zero-advantage row has the KL's gradient: the exact update trains it; with
    ``optim.skip_zero_advantage_kl`` it is left out, and the step is that of the other rows alone
    (the token-mean denominator still counts every row)."""
    model, tok = build_tiny(0)
    batch = _batch(model, tok)
    adv = torch.zeros(batch.response_mask.shape)
    kept = batch.group_ids == 2
    adv[kept] = 1.0
    ref = (batch.old_logprobs - 0.3).masked_fill(~batch.response_mask, 0.0)  # a reference the policy differs from

    def step(mask: torch.Tensor, lr: float, **optim) -> tuple[torch.Tensor, dict]:
        cfg = load_config(
            None, {"loss": {"kl_coef": 0.5}, "optim": {"micro_batch_positions": 0, "grad_clip": 1e9, **optim}}
        )
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=lr)
        logs = update(m, opt, batch, adv, mask, cfg, torch.Generator().manual_seed(0), ref_logprobs=ref)
        return _params(m) - _params(model), logs

    exact, l_exact = step(batch.response_mask, 1.0)
    approx, l_approx = step(batch.response_mask, 1.0, skip_zero_advantage_kl=True)
    assert "update/skipped_rows" not in l_exact
    assert l_approx["update/skipped_rows"] == pytest.approx(9 / 12)
    assert float((exact - approx).norm() / exact.norm()) > 1e-3  # the skipped rows' KL gradient is missing
    # = the step on the kept rows alone, scaled by their share of the tokens (the denominator over every row)
    mask = batch.response_mask & kept[:, None]
    alone, _ = step(mask, float(mask.sum()) / float(batch.response_mask.sum()))
    assert torch.allclose(alone, approx, atol=1e-6, rtol=1e-4)  # float sums differ by CPU kind
