"""``python -m studies.values`` (legacy finding F3): the states of a tree, the ranking metric, and a quick run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies import values as vr


def _tree():
    """Two-level binary tree over 4 leaves: root 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6."""
    paths = [[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]]
    ends = [[1, 4], [1, 5], [2, 3], [2, 6]]
    tokens = [[10, 11, 12, 13, 14], [10, 11, 20, 21, 22, 23], [30, 31, 32, 33], [30, 31, 32, 40, 41, 42, 43]]
    return paths, ends, tokens


def test_inner_states_are_the_nodes_with_children_and_their_leaf_means():
    paths, ends, tokens = _tree()
    states = vr.inner_states(paths, ends, tokens, [0, 0, 0, 0], [1.0, 0.0, 1.0, 1.0])
    assert [(s.node, s.parent, s.depth, s.prefix, s.tree_value) for s in states] == [
        (0, -1, 0, [], 0.75),
        (1, 0, 1, [10, 11], 0.5),
        (2, 0, 1, [30, 31, 32], 1.0),
    ]
    assert [tokens[s.row][: len(s.prefix)] for s in states] == [s.prefix for s in states]  # the row holds the prefix
    assert all(len(tokens[s.row]) > len(s.prefix) for s in states)  # so the critic can read position len(prefix)


def test_step_rank_accuracy_over_parent_child_and_sibling_pairs():
    paths, ends, tokens = _tree()
    states = vr.inner_states(paths, ends, tokens, [0] * 4, [1.0, 0.0, 1.0, 1.0])
    assert vr.related_pairs(states) == [(0, 1), (0, 2), (1, 2)]  # two steps from the root, one pair of alternatives
    truth = [0.5, 0.2, 0.9]
    assert vr.step_rank_accuracy(states, truth, [0.0, 0.1, 0.8]) == (pytest.approx(2 / 3), 3)  # (0, 1) wrong
    assert vr.step_rank_accuracy(states, truth, [0.0, 0.9, 0.8]) == (pytest.approx(1 / 3), 3)
    assert vr.step_rank_accuracy(states, truth, [0.5, 0.4, 0.4]) == (pytest.approx(0.5), 3)  # a tie is half
    acc, pairs = vr.step_rank_accuracy(states, [0.5, 0.5, 0.55], [0.0, 0.4, 0.9])  # every gap below MIN_GAP
    assert pairs == 0 and acc != acc
    row = vr.score("x", states, truth, [0.6, 0.2, 0.6], 12.0)
    assert row.mae[0] == pytest.approx((0.1 + 0.0 + 0.3) / 3) and row.rank_acc == pytest.approx(2.5 / 3)
    assert row.states == 3 and row.pairs == 3


def test_quick_value_study_writes_rows_and_is_read_back(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    summary = vr.run_value_report(tmp_path / "out", quick=True)
    arms = [r["arm"] for r in summary["rows"]]
    assert arms[0] == "tree (b=2, D=2)" and arms[1:3] == ["mc K=1", "mc K=3"]
    assert arms[3:] == [
        "critic (16 samples)",
        "critic (32 samples)",
        "dual critic (16 samples)",
        "dual critic (32 samples)",
    ]
    for r in summary["rows"]:
        assert 0.0 <= r["mae"][0] <= 1.0 and r["states"] == summary["rows"][0]["states"] > 0
    # MC K=3 costs three times K=1's tokens per state
    assert summary["rows"][2]["tokens_per_state"] == pytest.approx(3 * summary["rows"][1]["tokens_per_state"])
    assert (tmp_path / "out" / "plots" / "value_error.png").stat().st_size > 10_000
    monkeypatch.setattr(vr, "RLTrainer", lambda *a, **k: pytest.fail("a finished report is read back, not rerun"))
    again = vr.run_value_report(tmp_path / "out", quick=True)
    assert again == json.loads((tmp_path / "out" / "summary.json").read_text())
    # a report made in another checkout (another absolute base path, the same config) is reused too
    moved = json.loads((tmp_path / "out" / "summary.json").read_text())
    moved["settings"]["base"] = "/elsewhere/creditrl/configs/demo_quick.yaml"
    (tmp_path / "out" / "summary.json").write_text(json.dumps(moved))
    assert vr.run_value_report(tmp_path / "out", quick=True)["settings"]["base"].startswith("/elsewhere")
