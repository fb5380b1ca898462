"""MCTS trees after a real search obey the backup identities; the verifier's NaN rule and cache."""

from __future__ import annotations

import math

import pytest

from creditrl.policy.engines import make_engine
from creditrl.search import SearchConfig, Verifier, make_context
from creditrl.search.mcts import grow_trees
from creditrl.search.tree import subtree


@pytest.mark.parametrize("leaf_value", ["prm", "rollout_oracle"])
def test_mcts_trees_satisfy_mean_backup_identities(leaf_value, step_policy, tiny_prm, task, problems) -> None:
    """Every evaluation is backed up once along its path, so for each node:
    non-terminal: N = [own evaluation] + sum N(children), W = own value + sum W(children);
    terminal: every visit backs up its one verifier value, W = N * value."""
    model, tok = step_policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    cfg = SearchConfig(
        method="mcts", leaf_value=leaf_value, expansions=3, simulations=15, budget=600, max_new_tokens=32
    )
    ctx = make_context(problems, engine=engine, tokenizer=tok, task=task, config=cfg, prm=tiny_prm)
    roots = grow_trees(ctx)
    terminals = 0
    for root in roots:
        assert root.visits > 0 and root.evaluation is None
        for node in subtree(root):
            if node.children:
                assert sum(c.prior for c in node.children) == pytest.approx(1.0)
                assert all(
                    c.tokens[: len(node.tokens)] == node.tokens and len(c.tokens) > len(node.tokens)
                    for c in node.children
                )
            if node.terminal:
                terminals += 1
                assert not node.children and node.evaluation is not None
                assert node.value_sum == pytest.approx(node.visits * node.evaluation)
            else:
                own = node.evaluation is not None
                assert node.visits == own + sum(c.visits for c in node.children)
                assert node.value_sum == pytest.approx(
                    (node.evaluation or 0.0) + sum(c.value_sum for c in node.children)
                )
            assert 0.0 <= node.q <= 1.0
            if leaf_value == "prm" and node is not root:
                assert len(node.step_scores) >= 1
    assert terminals > 0  # the trees reached complete solutions, so the terminal rule was exercised
    assert max(len(list(subtree(r))) for r in roots) > 10


class FakePRM:
    """Scores step k as 0.1 * (k + 1), NaN for a step containing 'x'; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def score(self, tokenizer, examples, batch_size=32):
        self.calls += 1
        return [[math.nan if "x" in s else 0.1 * (k + 1) for k, s in enumerate(steps)] for _, steps in examples]


def test_verifier_reads_nan_as_zero_uses_last_step_for_orm_and_caches(task, problems) -> None:
    fake = FakePRM()
    v = Verifier(task, problems, prm=(fake, None), orm=(fake, None))
    items = [(0, "1+2=3;x;#3"), (1, ""), (0, "1+2=3;")]
    assert v.prm_steps(items) == [(0.1, 0.0, pytest.approx(0.3)), (), (0.1,)]
    assert fake.calls == 1
    assert v.prm_steps(items[:1]) == [(0.1, 0.0, pytest.approx(0.3))] and fake.calls == 1  # cached
    assert v.orm_scores(items) == [pytest.approx(0.3), 0.0, 0.1] and fake.calls == 2  # the ORM has its own cache
    with pytest.raises(ValueError, match="no PRM was given"):
        Verifier(task, problems).prm_steps(items)
