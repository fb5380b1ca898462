"""Search trees over reasoning steps: nodes, PUCT selection, mean backup and the answer rule.

A :class:`Node` is a partial response: the response tokens from the root (the bare prompt) to the
end of one reasoning step. Its children are one-step continuations sampled from the policy.
Beam search uses nodes as candidates (no tree statistics); MCTS keeps the statistics below.

Statistics (AlphaZero / PUCT, Silver et al. 2017, arXiv:1712.01815; step-level search as in
ReST-MCTS*, arXiv:2406.03816):

* ``N(s)`` visits, ``W(s)`` summed values, ``Q(s) = W(s) / N(s)``;
* ``P(c)``: the policy's probability of child step ``c`` (``exp`` of the sum of its token
  log-probs under the raw policy), summed over the samples that produced ``c`` and normalised
  over the siblings (see :func:`add_children`).

Selection (:func:`select_child`) maximises

    U(c) = Q(c) + c_puct * P(c) * sqrt(N(parent)) / (1 + N(c))

with ``N(parent)`` the parent's own visit count, and ``Q(c) = Q(parent)`` for an unvisited child
(``N(c) = 0``; 0 when the parent is unvisited too): an unvisited child is presumed as good as its
parent until evaluated ("first-play urgency" at the parent's mean). Ties go to the first child
(creation order). Backup (:func:`backup`) is the mean backup: every node on the path gets
``N += 1, W += v``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    """A partial (or complete) response: a path of reasoning steps from the root.

    Attributes:
        tokens: response tokens from the root to the end of this node's step (root: ``()``).
        parent: the node this step continues (None for the root).
        prior: ``P``, the sibling-normalised policy probability of this step.
        finished: the step ended with eos (a complete solution).
        terminal: ``finished``, or no room left under the response length cap; never expanded.
        text: the decoded response so far (special tokens dropped).
        step_scores: the PRM's probability of each step of ``text`` (empty until scored).
        evaluation: this node's own leaf value once evaluated (None before).
        visits, value_sum: ``N`` and ``W``.
        expanded: children have been sampled (a node is expanded at most once).
        solutions: completed rollouts started at this node, as ``(value, tokens)``.
    """

    tokens: tuple[int, ...] = ()
    parent: Node | None = None
    prior: float = 1.0
    finished: bool = False
    terminal: bool = False
    text: str = ""
    step_scores: tuple[float, ...] = ()
    evaluation: float | None = None
    visits: int = 0
    value_sum: float = 0.0
    expanded: bool = False
    children: list[Node] = field(default_factory=list)
    solutions: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)

    @property
    def q(self) -> float:
        """``Q = W / N``; 0.0 for an unvisited node."""
        return self.value_sum / self.visits if self.visits else 0.0


def puct_scores(parent: Node, c_puct: float) -> list[float]:
    """``U(c)`` for every child of ``parent`` (module docstring), in child order."""
    if c_puct < 0:
        raise ValueError(f"c_puct must be >= 0, got {c_puct}")
    explore = c_puct * math.sqrt(parent.visits)
    return [(c.q if c.visits else parent.q) + explore * c.prior / (1 + c.visits) for c in parent.children]


def select_child(parent: Node, c_puct: float) -> Node:
    """The child with the highest ``U`` (ties: the first). Raises ValueError without children."""
    if not parent.children:
        raise ValueError("select_child: the node has no children (expand it first)")
    scores = puct_scores(parent, c_puct)
    return parent.children[max(range(len(scores)), key=lambda i: (scores[i], -i))]


def select_leaf(root: Node, c_puct: float) -> list[Node]:
    """The path ``[root, ..., leaf]`` that PUCT selection descends: from the root, pick the child
    maximising ``U`` until a node that is terminal or not yet expanded."""
    path = [root]
    while path[-1].expanded and not path[-1].terminal:
        path.append(select_child(path[-1], c_puct))
    return path


def backup(path: Sequence[Node], value: float) -> None:
    """Mean backup: ``N += 1`` and ``W += value`` on every node of ``path`` (so ``Q = W / N``)."""
    if not math.isfinite(value):
        raise ValueError(f"backup: value must be finite, got {value}")
    for node in path:
        node.visits += 1
        node.value_sum += value


def add_children(node: Node, steps: Sequence[tuple[Sequence[int], float, bool]], *, max_len: int) -> list[Node]:
    """Add the sampled one-step continuations ``(step tokens, step log-prob, finished)`` of
    ``node`` as children and mark it expanded; returns the new children in first-sample order.

    Samples with identical step tokens become one child whose raw prior is the sum of
    ``exp(log-prob)`` over those samples; priors are then normalised over the new siblings.
    A child is terminal when finished (eos) or when its response reached ``max_len`` tokens.
    """
    merged: dict[tuple[int, ...], list] = {}  # step tokens -> [raw prior, finished]
    for tokens, logprob, finished in steps:
        merged.setdefault(tuple(tokens), [0.0, finished])[0] += math.exp(logprob)
    total = sum(p for p, _ in merged.values())
    children = []
    for key, (raw, finished) in merged.items():
        full = node.tokens + key
        children.append(
            Node(
                tokens=full,
                parent=node,
                prior=raw / total if total > 0 else 1.0 / len(merged),
                finished=finished,
                terminal=finished or len(full) >= max_len,
            )
        )
    node.children.extend(children)
    node.expanded = node.expanded or bool(children)
    return children


def subtree(node: Node) -> Iterator[Node]:
    """``node`` and every node below it (depth first)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def most_visited_path(root: Node) -> list[Node]:
    """From the root, repeatedly the most visited child (ties: higher ``Q``, then the first),
    until a terminal node or a node without visited children."""
    path = [root]
    while not path[-1].terminal:
        visited = [c for c in path[-1].children if c.visits > 0]
        if not visited:
            break
        path.append(max(visited, key=lambda c: (c.visits, c.q, -path[-1].children.index(c))))
    return path


def best_solution(node: Node) -> tuple[float, tuple[int, ...]] | None:
    """The best complete solution found at or below ``node`` by value: terminal nodes (their
    ``evaluation``) and completed rollouts (their verifier value); ties: the first found.
    None when there is none."""
    found = [
        solution
        for n in subtree(node)
        for solution in ([(n.evaluation, n.tokens)] if n.terminal and n.evaluation is not None else []) + n.solutions
    ]
    return max(found, key=lambda solution: solution[0], default=None)
