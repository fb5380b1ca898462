"""train_prm: learns a synthetic step rule, soft targets, per-member data order, drop counts."""

import random

import pytest
import torch

from creditrl.policy.model import TinyPreset, build_tiny
from creditrl.prm.data import StepwiseExample
from creditrl.prm.model import ProcessRewardModel
from creditrl.prm.train import _batches, train_prm

SMALL = TinyPreset(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=32)


def small_prm(members: int = 1, seed: int = 0):
    policy, tok = build_tiny(0, SMALL)
    return ProcessRewardModel.from_model(policy, members=members, seed=seed), tok


def digit_rule_examples(n: int, rng: random.Random) -> list[StepwiseExample]:
    """1-3 steps of 2-4 random digits and ';'; a step is wrong iff it contains a '7'."""
    out = []
    for _ in range(n):
        steps = [
            "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 4))) + ";" for _ in range(rng.randint(1, 3))
        ]
        out.append(StepwiseExample("q=", steps, [0.0 if "7" in s else 1.0 for s in steps]))
    return out


def pairwise_auroc(scores, labels):
    """Reference AUROC: the share of (positive, negative) pairs ordered right (ties count half)."""
    pos = [s for s, y in zip(scores, labels) if y == 1.0]
    neg = [s for s, y in zip(scores, labels) if y == 0.0]
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))


def test_learns_a_step_rule_on_held_out_examples():
    rng = random.Random(0)
    train, heldout = digit_rule_examples(400, rng), digit_rule_examples(120, rng)
    prm, tok = small_prm()
    before = prm.score(tok, [(e.prompt, e.completions) for e in heldout])
    metrics = train_prm(prm, tok, train, steps=120, batch_size=16, lr=3e-3, seed=0, progress=False)
    after = prm.score(tok, [(e.prompt, e.completions) for e in heldout])
    labels = [y for e in heldout for y in e.labels]
    assert pairwise_auroc([x for r in before for x in r], labels) < 0.75
    assert pairwise_auroc([x for r in after for x in r], labels) > 0.95
    assert metrics["prm/loss_final"] < 0.3 * metrics["prm/loss_first"]
    assert len(metrics["prm/loss_curve"]) == 10 and metrics["prm/loss_curve"][-1] < metrics["prm/loss_curve"][0]
    assert metrics["prm/examples_used"] == 400
    assert metrics["prm/labelled_steps"] == sum(len(e.completions) for e in train)
    assert not prm.training


@pytest.mark.parametrize("soft", [True, False])
def test_soft_labels_are_the_targets_only_when_soft(soft):
    rng = random.Random(1)
    examples = [
        StepwiseExample("q=", [f"{rng.randint(10, 99)};", f"{rng.randint(10, 99)};"], [0.3, 0.8]) for _ in range(64)
    ]
    prm, tok = small_prm()
    metrics = train_prm(prm, tok, examples, steps=60, batch_size=16, lr=3e-3, soft=soft, progress=False)
    scores = torch.tensor(prm.score(tok, [(e.prompt, e.completions) for e in examples[:16]]))  # (16, 2)
    expected = [0.3, 0.8] if soft else [0.0, 1.0]
    assert metrics["prm/positive_fraction"] == pytest.approx(sum(expected) / 2)
    from creditrl.prm.train import _prepare

    data, _ = _prepare(tok, examples, soft=soft, max_step_tokens=None, max_len=prm.max_positions)
    assert len({len(d.ids) for d in data}) == 1  # every example encodes to one length L: no padding
    assert metrics["prm/trained_positions"] == 60 * 16 * len(data[0].ids)  # steps x batch x L, one member
    assert scores.mean(0).tolist() == pytest.approx(expected, abs=0.08)


def test_each_member_trains_as_if_alone_on_its_own_order():
    rng = random.Random(2)
    examples = digit_rule_examples(48, rng)
    probe = [(e.prompt, e.completions) for e in examples[:8]]
    pair, tok = small_prm(members=2, seed=5)
    single, _ = small_prm(members=1, seed=5)
    kwargs = dict(steps=6, batch_size=4, lr=3e-3, seed=11, progress=False)
    train_prm(pair, tok, examples, **kwargs)
    train_prm(single, tok, examples, **kwargs)
    members = pair.member_scores(tok, probe)
    alone = single.member_scores(tok, probe)
    for m, a in zip(members, alone):
        assert torch.allclose(m[0], a[0], atol=1e-6)  # member 0: same head seed, same order
        assert not torch.allclose(m[0], m[1], atol=1e-4)


def test_batches_cover_every_item_once_per_epoch_and_depend_on_the_seed():
    batches = _batches(10, 4, random.Random(0))
    drawn = [i for _ in range(5) for i in next(batches)]  # 20 = two epochs
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:]) == list(range(10))
    other = _batches(10, 4, random.Random(1))
    assert [i for _ in range(5) for i in next(other)] != drawn


def test_dropped_and_skipped_examples_are_counted():
    examples = [
        StepwiseExample("q=", ["12;", "34;"], [1.0, 0.0]),
        StepwiseExample("q=", ["12;", "123456;"], [1.0, None]),  # a step of 7 tokens: dropped
        StepwiseExample("q=", ["12;", "34;"], [None, None]),  # nothing to learn: dropped
        StepwiseExample("q=", ["1;", "2;", "3;"], [None, 0.6, 0.4]),  # None skipped: 2 labels
        StepwiseExample("q=", ["1234;", "5678;", "9;"], [1.0, 1.0, 0.0]),  # max_len 12: 2 steps cut
    ]
    prm, tok = small_prm()
    metrics = train_prm(prm, tok, examples, steps=1, batch_size=2, max_step_tokens=5, max_len=12, progress=False)
    assert metrics["prm/examples_dropped_long_step"] == 1
    assert metrics["prm/examples_dropped_unlabelled"] == 1
    assert metrics["prm/examples_used"] == 3
    assert metrics["prm/steps_truncated"] == 2
    assert metrics["prm/labelled_steps"] == 2 + 2 + 1
    assert metrics["prm/positive_fraction"] == pytest.approx(3 / 5)  # 0.6 -> 1, 0.4 -> 0 when hard
    unlimited = train_prm(prm, tok, examples, steps=1, batch_size=2, progress=False)
    assert unlimited["prm/examples_dropped_long_step"] == 0 and unlimited["prm/examples_used"] == 4


def test_no_usable_example_is_an_error():
    prm, tok = small_prm()
    with pytest.raises(ValueError, match="no usable"):
        train_prm(prm, tok, [StepwiseExample("q=", ["1;"], [None])], steps=1, progress=False)
