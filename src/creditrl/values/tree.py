"""Tree rollouts and tree values (``value.source=tree``): step-level credit from outcomes only.

TreeRL (Hou et al., 2025, arXiv:2506.11902) and SPO-tree (Guo et al., 2025, arXiv:2505.23564)
sample one prompt's responses as a tree that branches at step boundaries and use the tree itself
as the value estimate: a node's value is the mean outcome of the leaves below it, and a segment
(tree edge) gets the advantage ``V(child) - V(parent)`` on all its tokens.

Shape (``value.tree_branching`` = b, ``value.tree_depth`` = D). Level 0 is the prompt. At levels
1 .. D-1 every live node is continued by b samples of ONE step (generation stops after the step
separator, ``SamplingParams.stop_ids``); at level D by b samples to the end of the response. A
node is a leaf when its segment ended with eos, used up the response budget
(``rollout.max_new_tokens`` from the start of the response), or is at level D. Without early
leaves a prompt has b^D responses of D segments each. A shared segment is generated once
(``generated_tokens`` counts it once).

Values. With the outcome o(l) in {0, 1} of each leaf l (the task's outcome checker),
``V(n) = mean of o(l) over the leaves l below n``. Every token of a segment gets the value of its
parent node, and the segments are the time steps of credit (:attr:`TreeValues.segment_ends`
replaces the task's step ends), so ``gae`` with gamma = 1, lam = 0 at step resolution gives each
segment ``r_k + V(child) - V(parent)``: ``V(child) - V(parent)`` on inner segments and
``o(l) - V(parent)`` on the final one (the outcome reward lands on its last token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from creditrl.policy.engines import Generation, GenerationEngine, SamplingParams


@dataclass(frozen=True)
class TreeShape:
    branching: int  # b: children per node
    depth: int  # D: levels of branching; the last one samples to the end

    def __post_init__(self) -> None:
        if self.branching < 1 or self.depth < 1:
            raise ValueError(f"tree branching and depth must be >= 1, got {self.branching}, {self.depth}")

    @property
    def leaves(self) -> int:
        return self.branching**self.depth


@dataclass
class _Node:
    problem: int
    parent: int  # node id, -1 for a root
    tokens: list[int]  # the whole response prefix up to the end of this node's segment
    logprobs: list[float]
    finished: bool = False  # the segment ended with eos
    leaf: bool = False


@dataclass
class TreeRollout:
    """The leaves of every prompt's tree as one :class:`Generation` (problem-major), plus, per
    leaf, the node path ``root, ..., leaf`` (global node ids) and the response index of the last
    token of each of its segments."""

    generation: Generation
    paths: list[list[int]]  # per leaf: node ids from its root to itself (segments = len - 1)
    segment_ends: list[list[int]]  # per leaf: last token index of each segment, ascending
    generated_tokens: int  # every sampled token once (shared segments are not repeated)


def tree_rollout(
    engine: GenerationEngine,
    prompts: Sequence[Sequence[int]],
    shape: TreeShape,
    params: SamplingParams,
    stop_ids: tuple[int, ...],
    generator: torch.Generator | None,
) -> TreeRollout:
    """Sample one tree per prompt (see the module docstring); one ``engine.generate`` call per
    level for all prompts' live nodes, each capped at what its prefix left of
    ``params.max_new_tokens``."""
    if shape.depth > 1 and not stop_ids:
        raise ValueError("tree rollouts need stop_ids (the tokens that end a step) when depth > 1")
    budget = params.max_new_tokens
    nodes = [_Node(problem=i, parent=-1, tokens=[], logprobs=[]) for i in range(len(prompts))]
    frontier = list(range(len(prompts)))
    generated = 0
    for level in range(1, shape.depth + 1):
        live = [n for n in frontier if not nodes[n].leaf]
        if not live:
            break
        last = level == shape.depth
        step_params = replace(params, stop_ids=() if last else tuple(stop_ids))
        gen = engine.generate(
            [list(prompts[nodes[n].problem]) + nodes[n].tokens for n in live],
            shape.branching,
            step_params,
            generator=generator,
            budgets=[budget - len(nodes[n].tokens) for n in live],
        )
        frontier = []
        for request, tokens, logps, finished in zip(gen.prompt_index, gen.tokens, gen.logprobs, gen.finished):
            parent = nodes[live[request]]
            child = _Node(
                problem=parent.problem,
                parent=live[request],
                tokens=parent.tokens + list(tokens),
                logprobs=parent.logprobs + list(logps),
                finished=bool(finished),
            )
            child.leaf = last or child.finished or len(child.tokens) >= budget
            generated += len(tokens)
            frontier.append(len(nodes))
            nodes.append(child)

    leaves = sorted((i for i, n in enumerate(nodes) if n.leaf), key=lambda i: (nodes[i].problem, i))
    paths, ends = [], []
    for leaf in leaves:
        path = [leaf]
        while nodes[path[-1]].parent >= 0:
            path.append(nodes[path[-1]].parent)
        path.reverse()
        paths.append(path)
        ends.append([len(nodes[n].tokens) - 1 for n in path[1:]])
    generation = Generation(
        prompt_index=[nodes[i].problem for i in leaves],
        prompt_ids=[list(prompts[nodes[i].problem]) for i in leaves],
        tokens=[nodes[i].tokens for i in leaves],
        logprobs=[nodes[i].logprobs for i in leaves],
        finished=[nodes[i].finished for i in leaves],
    )
    return TreeRollout(generation, paths, ends, generated)


@dataclass
class TreeValues:
    values: Tensor  # float (B, T): V(parent node of the token's segment); 0 on masked tokens
    segment_ends: Tensor  # bool (B, T): True on the last token of each segment
    node_values: dict[int, float]  # V(n) for every node on some row's path


def tree_values(
    paths: Sequence[Sequence[int]],
    segment_ends: Sequence[Sequence[int]],
    outcomes: Sequence[float],
    response_mask: Tensor,
) -> TreeValues:
    """Node values = mean outcome of the leaves below (``outcomes[b]`` of row b's leaf), spread
    over each row's tokens by segment, see the module docstring. ``paths``/``segment_ends`` are
    per row, as :class:`TreeRollout` gives them; ``response_mask`` bool (B, T)."""
    rows, width = response_mask.shape
    if not (len(paths) == len(segment_ends) == len(outcomes) == rows):
        raise ValueError(
            f"tree_values: need one path, segment list and outcome per row ({rows}); "
            f"got {len(paths)}, {len(segment_ends)}, {len(outcomes)}"
        )
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for path, o in zip(paths, outcomes):
        for n in path:
            total[n] = total.get(n, 0.0) + float(o)
            count[n] = count.get(n, 0) + 1
    node_values = {n: total[n] / count[n] for n in total}
    values = torch.zeros(rows, width)
    ends = torch.zeros(rows, width, dtype=torch.bool)
    for b, (path, seg_ends) in enumerate(zip(paths, segment_ends)):
        if len(seg_ends) != len(path) - 1:
            raise ValueError(f"tree_values: row {b} has {len(path) - 1} segments but {len(seg_ends)} segment ends")
        start = 0
        for parent, end in zip(path[:-1], seg_ends):
            values[b, start : end + 1] = node_values[parent]
            ends[b, min(end, width - 1)] = True
            start = end + 1
    mask = response_mask.bool()
    return TreeValues(torch.where(mask, values, 0.0), ends & mask, node_values)


def generated_tokens(paths: Sequence[Sequence[int]], segment_ends: Sequence[Sequence[int]]) -> int:
    """Tokens sampled to build these rows' trees: each segment (tree edge, keyed by its child
    node) counted once however many rows share it."""
    seen: dict[int, int] = {}
    for path, ends in zip(paths, segment_ends):
        start = 0
        for child, end in zip(path[1:], ends):
            seen[child] = end + 1 - start
            start = end + 1
    return sum(seen.values())
