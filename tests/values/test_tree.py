"""Tree rollouts and tree values (value.source=tree) against hand-computed trees."""

from __future__ import annotations

import pytest
import torch

from creditrl.config import ConfigError, load_config
from creditrl.credit import estimate_at
from creditrl.policy.engines import HFEngine, SamplingParams
from creditrl.train.resolve import checked
from creditrl.values.tree import TreeShape, generated_tokens, tree_rollout, tree_values


def test_tree_advantages_equal_hand_computed_values():
    # root 0 -> a=1, b=2 ; a -> leaves 3 (o=1), 4 (o=0) ; b -> leaves 5 (o=1), 6 (o=1)
    paths = [[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]]
    ends = [[1, 4], [1, 3], [2, 5], [2, 4]]  # first segments: 2 / 3 tokens; rows of 5, 4, 6, 5 tokens
    lengths = [5, 4, 6, 5]
    mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
    outcomes = [1.0, 0.0, 1.0, 1.0]
    tv = tree_values(paths, ends, outcomes, mask)
    assert tv.node_values == {0: 0.75, 1: 0.5, 2: 1.0, 3: 1.0, 4: 0.0, 5: 1.0, 6: 1.0}
    expected_values = [
        [0.75, 0.75, 0.5, 0.5, 0.5, 0.0],
        [0.75, 0.75, 0.5, 0.5, 0.0, 0.0],
        [0.75, 0.75, 0.75, 1.0, 1.0, 1.0],
        [0.75, 0.75, 0.75, 1.0, 1.0, 0.0],
    ]
    assert tv.values.tolist() == expected_values
    assert tv.segment_ends.nonzero().tolist() == [[0, 1], [0, 4], [1, 1], [1, 3], [2, 2], [2, 5], [3, 2], [3, 4]]

    rewards = torch.zeros(4, 6)
    reward_mask = torch.zeros(4, 6, dtype=torch.bool)
    for b, n in enumerate(lengths):
        rewards[b, n - 1], reward_mask[b, n - 1] = outcomes[b], True
    adv, _ = estimate_at(
        "step",
        "gae",
        rewards,
        reward_mask,
        mask,
        step_ends=tv.segment_ends,
        group_ids=torch.zeros(4, dtype=torch.long),
        values=tv.values,
        gamma=1.0,
        lam=0.0,
    )
    # A = V(child) - V(parent) on the first segment, outcome - V(parent) on the last
    first = {0: 0.5 - 0.75, 1: 0.5 - 0.75, 2: 1.0 - 0.75, 3: 1.0 - 0.75}
    last = {0: 1.0 - 0.5, 1: 0.0 - 0.5, 2: 0.0, 3: 0.0}
    for b, n in enumerate(lengths):
        split = ends[b][0] + 1
        row = adv[b].tolist()
        assert row[:split] == pytest.approx([first[b]] * split)
        assert row[split:n] == pytest.approx([last[b]] * (n - split))
        assert row[n:] == [0.0] * (6 - n)
    assert generated_tokens(paths, ends) == 2 + 3 + (4 - 1) + (3 - 1) + (5 - 2) + (4 - 2)


def test_tree_values_reject_inconsistent_rows():
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="need one path, segment list and outcome per row"):
        tree_values([[0, 1]], [[2]], [1.0, 0.0], mask)
    with pytest.raises(ValueError, match="row 0 has 1 segments but 2 segment ends"):
        tree_values([[0, 1]], [[0, 2]], [1.0], mask)
    with pytest.raises(ValueError, match="branching and depth must be >= 1"):
        TreeShape(0, 2)


@pytest.fixture(scope="module")
def engine_and_stop(peaked_tiny):
    model, tok = peaked_tiny(0, 123)
    eos = 57
    engine = HFEngine(model, eos_id=eos, pad_id=tok.pad_token_id)
    # the most frequent sampled token (not eos) ends a "step", so trees branch several times
    gen = engine.generate(
        [[1, 5, 6]], 16, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(0)
    )
    counts: dict[int, int] = {}
    for toks in gen.tokens:
        for t in toks:
            if t != eos:
                counts[t] = counts.get(t, 0) + 1
    return engine, eos, (max(counts, key=counts.get),)


@pytest.mark.parametrize("branching,depth", [(2, 3), (3, 2), (4, 1)])
def test_tree_rollout_structure(engine_and_stop, branching, depth):
    engine, eos, stop = engine_and_stop
    prompts = [[1, 5, 6], [1, 20, 30, 40]]
    params = SamplingParams(max_new_tokens=12)
    out = tree_rollout(engine, prompts, TreeShape(branching, depth), params, stop, torch.Generator().manual_seed(1))
    gen = out.generation
    per_prompt = [gen.prompt_index.count(i) for i in range(len(prompts))]
    assert all(1 <= n <= branching**depth for n in per_prompt)
    assert gen.prompt_index == sorted(gen.prompt_index)
    by_node: dict[int, list[int]] = {}
    total = 0
    for i, (path, ends, toks, lps) in enumerate(zip(out.paths, out.segment_ends, gen.tokens, gen.logprobs)):
        assert gen.prompt_ids[i] == prompts[gen.prompt_index[i]]
        assert len(toks) == len(lps) <= params.max_new_tokens
        assert len(ends) == len(path) - 1 <= depth and ends[-1] == len(toks) - 1
        assert ends == sorted(ends)
        # a segment that is not the last ends with a stop token and was not the end of the response
        for e in ends[:-1]:
            assert toks[e] in stop
        assert gen.finished[i] == (toks[-1] == eos)
        if len(path) - 1 < depth:  # an early leaf: eos or out of budget
            assert gen.finished[i] or len(toks) == params.max_new_tokens
        # rows through the same node share its prefix exactly (tokens and log-probs)
        for node, end in zip(path[1:], ends):
            prefix = toks[: end + 1] + [round(x, 6) for x in lps[: end + 1]]
            assert by_node.setdefault(node, prefix) == prefix
        total += len(toks)
    assert out.generated_tokens == generated_tokens(out.paths, out.segment_ends) <= total
    if depth > 1 and max(per_prompt) > branching:
        assert out.generated_tokens < total  # shared segments are generated once


def test_tree_rollout_needs_stop_ids_to_branch(engine_and_stop):
    engine, _, _ = engine_and_stop
    with pytest.raises(ValueError, match="tree rollouts need stop_ids"):
        tree_rollout(engine, [[1, 2]], TreeShape(2, 2), SamplingParams(max_new_tokens=4), (), None)


def test_config_checks_for_tree_values():
    with pytest.raises(ConfigError, match="must equal value.tree_branching \\*\\* value.tree_depth = 8, got 4"):
        checked(load_config(overrides=["value.source=tree", "credit.estimator=gae", "rollout.group_size=4"]))
    with pytest.raises(ConfigError, match="gives values that estimator 'grpo' never reads"):
        checked(load_config(overrides=["value.source=tree", "rollout.group_size=8"]))
    with pytest.raises(ConfigError, match="train.max_tokens: must be >= 0"):
        checked(load_config(overrides=["train.max_tokens=-1"]))
    cfg = load_config(overrides=["value.source=tree", "credit.estimator=gae", "rollout.group_size=8"])
    assert (cfg.value.tree_branching, cfg.value.tree_depth) == (2, 3)
