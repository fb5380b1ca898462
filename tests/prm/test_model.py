"""ProcessRewardModel: step-end encoding, scores, ensembles, save/load."""

import pytest
import torch

from creditrl.policy.model import TinyPreset, build_tiny
from creditrl.prm.model import ProcessRewardModel, encode, right_pad

SMALL = TinyPreset(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=64)
EXAMPLES = [
    ("7+3*2=", ["3*2=6;", "7+6=13;", "#13"]),
    ("1+1=", ["1+1=2;", "#2"]),
    ("9-4*2+1=", ["4*2=8;", "9-8=1;", "1+1=2;", "#2"]),
]


def small_prm(members: int = 1, *, combine: str = "mean", share: bool = False, seed: int = 0):
    policy, tok = build_tiny(0, SMALL)
    prm = ProcessRewardModel.from_model(policy, members=members, combine=combine, seed=seed, share_backbone=share)
    with torch.no_grad():  # heads far from zero, so members disagree visibly
        for head in prm.heads:
            head.weight.mul_(30.0)
    return prm, tok


def test_encode_positions_point_at_step_ends():
    _, tok = build_tiny(0, SMALL)
    prompt, steps = EXAMPLES[0]
    ids, ends = encode(tok, prompt, steps, max_len=64)
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids[1:]) == prompt + "".join(steps)
    assert len(ends) == len(steps)
    assert [tok.convert_ids_to_tokens(ids[e]) for e in ends] == [";", ";", "3"]
    # the tokens between consecutive ends are exactly the step texts
    bounds = [len(prompt)] + ends  # index of the last prompt token, then each step end
    assert [tok.decode(ids[a + 1 : b + 1]) for a, b in zip(bounds, ends)] == steps


def test_encode_drops_steps_that_do_not_fit_and_rejects_bad_input():
    _, tok = build_tiny(0, SMALL)
    prompt, steps = EXAMPLES[0]  # 1 + 6 prompt tokens, steps of 6, 7, 3 tokens
    ids, ends = encode(tok, prompt, steps, max_len=19)
    assert ends == [12] and len(ids) == 13  # the second step (to 20 tokens) does not fit
    assert encode(tok, prompt, steps, max_len=20)[1] == [12, 19]
    with pytest.raises(ValueError, match="max_len"):
        encode(tok, prompt, steps, max_len=6)
    with pytest.raises(ValueError, match="empty"):
        encode(tok, prompt, ["3*2=6;", ""], max_len=64)


def test_forward_shape_and_shape_check():
    prm, tok = small_prm(members=3)
    ids, mask = right_pad([[1, 20, 21], [1, 22]], tok.pad_token_id)
    assert prm(ids, mask).shape == (3, 2, 3)
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        prm(ids[0], mask[0])


def test_scores_are_probabilities_one_per_step():
    prm, tok = small_prm(members=2)
    scores = prm.score(tok, EXAMPLES, batch_size=2)
    assert [len(s) for s in scores] == [len(steps) for _, steps in EXAMPLES]
    flat = [x for row in scores for x in row]
    assert all(0.0 < x < 1.0 for x in flat)
    assert len(set(flat)) == len(flat)  # the heads read different states


def test_scores_do_not_depend_on_batching_or_later_steps():
    prm, tok = small_prm(members=2)
    alone = [prm.score(tok, [ex])[0] for ex in EXAMPLES]
    batched = prm.score(tok, EXAMPLES, batch_size=3)
    for a, b in zip(alone, batched):
        assert a == pytest.approx(b, abs=1e-5)  # right padding is invisible
    prompt, steps = EXAMPLES[2]
    changed = prm.score(tok, [(prompt, steps[:2] + ["5+5=10;", "#10"])])[0]
    assert changed[:2] == pytest.approx(batched[2][:2], abs=1e-5)  # causal: a step sees only its prefix
    assert changed[2] != pytest.approx(batched[2][2], abs=1e-5)


def test_steps_beyond_max_len_score_nan():
    prm, tok = small_prm()
    (scores,) = prm.score(tok, [EXAMPLES[0]], max_len=19)
    assert 0.0 < scores[0] < 1.0
    assert all(x != x for x in scores[1:])  # NaN


@pytest.mark.parametrize("share", [False, True])
def test_ensemble_combines_members_by_mean_and_min(share):
    prm, tok = small_prm(members=3, share=share)
    assert len(prm.backbones) == (1 if share else 3) and prm.share_backbone == share
    members = prm.member_scores(tok, EXAMPLES)
    assert [m.shape for m in members] == [(3, len(s)) for _, s in EXAMPLES]
    assert all((m.max(0).values - m.min(0).values).min() > 1e-4 for m in members)  # members differ
    mean = prm.score(tok, EXAMPLES)
    prm.combine = "min"
    low = prm.score(tok, EXAMPLES)
    for m, a, b in zip(members, mean, low):
        assert a == pytest.approx(m.mean(0).tolist(), abs=1e-6)
        assert b == pytest.approx(m.min(0).values.tolist(), abs=1e-6)
        assert all(x < y for x, y in zip(b, a))
    with pytest.raises(ValueError, match="mean, min"):
        prm.combine = "max"


def test_members_differ_by_head_seed_and_seed_is_reproducible():
    a, _ = small_prm(members=2, seed=1)
    b, _ = small_prm(members=2, seed=1)
    c, _ = small_prm(members=2, seed=2)
    assert torch.equal(a.heads[0].weight, b.heads[0].weight)
    assert not torch.equal(a.heads[0].weight, a.heads[1].weight)
    assert not torch.equal(a.heads[0].weight, c.heads[0].weight)


@pytest.mark.parametrize("share", [False, True])
def test_save_load_round_trip_gives_identical_scores(tmp_path, share):
    prm, tok = small_prm(members=2, combine="min", share=share)
    before = prm.score(tok, EXAMPLES)
    prm.save(tmp_path / "prm")
    loaded = ProcessRewardModel.load(tmp_path / "prm")
    assert loaded.members == 2 and loaded.combine == "min" and loaded.share_backbone == share
    assert loaded.score(tok, EXAMPLES) == before


def test_from_policy_tiny_has_no_lm_head():
    prm = ProcessRewardModel.from_policy("tiny", members=2, combine="min", seed=3)
    assert prm.members == 2 and prm.combine == "min" and len(prm.backbones) == 2
    assert not any("lm_head" in name for name, _ in prm.named_parameters())
    assert prm.max_positions == TinyPreset().max_positions
    assert all(p.requires_grad for p in prm.parameters())


# ----------------------------------------------------------------------------- likelihood features


def test_step_positions_marks_each_steps_tokens() -> None:
    from creditrl.prm.model import step_positions

    # bos + 3 prompt tokens (positions 0-3), steps end at 6 and 9, then 2 padding positions
    assert step_positions([6, 9], 4, 12) == [-1, -1, -1, -1, 0, 0, 0, 1, 1, 1, -1, -1]
    assert step_positions([], 4, 5) == [-1] * 5


def test_likelihood_features_equal_a_slow_loop_and_survive_save_load(tmp_path) -> None:
    import torch

    from creditrl.policy.model import TinyPreset, build_tiny
    from creditrl.policy.tokenizer import encode_prompt
    from creditrl.prm.model import ProcessRewardModel, encode, right_pad

    policy, tok = build_tiny(3, TinyPreset(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    prm = ProcessRewardModel.from_model(policy, members=2, likelihood=True, seed=1)
    with torch.no_grad():
        for f in prm.feature_heads:
            f.weight.copy_(torch.tensor([[0.3, -0.7]]))
    examples = [("7+3*2=", ["3*2=6;", "7+6=13;", "#13"]), ("1-2=", ["1-2=-1;", "#-1"])]
    scores = prm.member_scores(tok, examples)
    for (prompt, steps), got in zip(examples, scores):
        ids, ends = encode(tok, prompt, steps, max_len=100)
        x = torch.tensor([ids])
        for m in range(2):
            with torch.no_grad():
                states = prm.backbones[m](input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
                logp = torch.log_softmax(prm.reference(input_ids=x).logits[0], -1)
                heads_out = prm.heads[m](states)
            start = len(encode_prompt(tok, prompt))
            for k, end in enumerate(ends):
                lps = [float(logp[t - 1, ids[t]]) for t in range(start, end + 1)]
                base = float(heads_out[end])
                want = torch.sigmoid(torch.tensor(base + 0.3 * sum(lps) - 0.7 * min(lps)))
                assert float(got[m, k]) == pytest.approx(float(want), abs=1e-5)
                start = end + 1
    prm.save(tmp_path / "p")
    again = ProcessRewardModel.load(tmp_path / "p")
    assert again.likelihood and torch.allclose(
        torch.stack([r.flatten() for r in again.member_scores(tok, examples[:1])]),
        torch.stack([r.flatten() for r in scores[:1]]),
    )
    ids, mask = right_pad([encode(tok, *examples[0], max_len=100)[0]], tok.pad_token_id)
    with pytest.raises(ValueError, match="needs step_index"):
        prm(ids, mask)
