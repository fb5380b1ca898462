"""PUCT selection, mean backup, child merging and the answer rule on hand-built trees."""

from __future__ import annotations

import math

import pytest

from creditrl.search.tree import (
    Node,
    add_children,
    backup,
    best_solution,
    most_visited_path,
    puct_scores,
    select_child,
    select_leaf,
)


def hand_tree() -> tuple[Node, Node, Node, Node, Node]:
    """root -> parent (N=10, W=5) -> a (N=4, W=2, P=0.5), b (N=1, W=0.9, P=0.2), c (N=0, P=0.3)."""
    root = Node(visits=11, value_sum=5.4, expanded=True)
    parent = Node(tokens=(1,), parent=root, visits=10, value_sum=5.0, expanded=True)
    root.children = [parent]
    a = Node(tokens=(1, 2), parent=parent, prior=0.5, visits=4, value_sum=2.0)
    b = Node(tokens=(1, 3), parent=parent, prior=0.2, visits=1, value_sum=0.9)
    c = Node(tokens=(1, 4), parent=parent, prior=0.3)
    parent.children = [a, b, c]
    return root, parent, a, b, c


def test_puct_scores_and_selection_match_hand_computation() -> None:
    _, parent, a, b, c = hand_tree()
    s = math.sqrt(10)
    # U = Q + c_puct P sqrt(N_parent) / (1 + N); the unvisited child c takes Q(parent) = 0.5
    expected = [0.5 + 1.5 * 0.5 * s / 5, 0.9 + 1.5 * 0.2 * s / 2, 0.5 + 1.5 * 0.3 * s / 1]
    assert puct_scores(parent, 1.5) == pytest.approx(expected)
    assert expected == pytest.approx([0.974342, 1.374342, 1.923025], abs=1e-6)
    assert select_child(parent, 1.5) is c  # exploration favours the unvisited child
    assert select_child(parent, 0.1) is b  # little exploration: the best Q (0.9) wins
    assert select_child(parent, 0.0) is b


def test_unvisited_child_of_unvisited_parent_has_q_zero_and_ties_go_first() -> None:
    parent = Node(expanded=True)
    parent.children = [Node(prior=0.5), Node(prior=0.5)]
    assert puct_scores(parent, 2.0) == [0.0, 0.0]  # N(parent) = 0: no exploration term, Q = 0
    assert select_child(parent, 2.0) is parent.children[0]


def test_mean_backup_updates_n_w_q_along_the_path() -> None:
    root, parent, _, b, _ = hand_tree()
    backup([root, parent, b], 0.3)
    assert (b.visits, b.value_sum, b.q) == (2, pytest.approx(1.2), pytest.approx(0.6))
    assert (parent.visits, parent.q) == (11, pytest.approx(5.3 / 11))
    assert (root.visits, root.q) == (12, pytest.approx(5.7 / 12))
    with pytest.raises(ValueError, match="finite"):
        backup([root], float("nan"))


def test_select_leaf_descends_until_unexpanded_or_terminal() -> None:
    root, parent, _, _, c = hand_tree()
    assert select_leaf(root, 1.5) == [root, parent, c]
    c.terminal, c.expanded = True, True
    c.children = [Node(parent=c)]
    assert select_leaf(root, 1.5)[-1] is c  # a terminal node is never descended into


def test_add_children_merges_identical_steps_and_sums_priors() -> None:
    node = Node(tokens=(7,))
    steps = [
        ((1, 2), math.log(0.2), False),
        ((3,), math.log(0.1), True),
        ((1, 2), math.log(0.2), False),
        ((4, 4, 4), math.log(0.1), False),
    ]
    kids = add_children(node, steps, max_len=4)
    assert [k.tokens for k in kids] == [(7, 1, 2), (7, 3), (7, 4, 4, 4)]
    assert [k.prior for k in kids] == pytest.approx([0.4 / 0.6, 0.1 / 0.6, 0.1 / 0.6])
    assert [(k.finished, k.terminal) for k in kids] == [(False, False), (True, True), (False, True)]  # length cap 4
    assert node.expanded and node.children == kids and all(k.parent is node for k in kids)


def test_answer_rule_follows_visits_then_best_solution_below() -> None:
    root, parent, a, b, c = hand_tree()
    assert most_visited_path(root) == [root, parent, a]  # a has 4 visits
    a.solutions = [(0.2, (1, 2, 9)), (0.7, (1, 2, 8))]
    a.children = [Node(tokens=(1, 2, 5), parent=a, terminal=True, finished=True, evaluation=0.6, visits=1)]
    assert best_solution(a) == (0.7, (1, 2, 8))
    assert best_solution(b) is None
    b.visits = 4
    b.value_sum = 3.0
    assert most_visited_path(root)[-1] is b  # visit tie: the higher Q wins
