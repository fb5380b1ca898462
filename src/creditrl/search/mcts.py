"""Monte-Carlo tree search over reasoning steps (PUCT selection, mean backup; see :mod:`.tree`).

One simulation of one problem's tree:

1. **select**: from the root, descend by PUCT to a leaf: a terminal node or one not yet expanded;
2. a **terminal** leaf (its step ended with eos, or the response reached the length cap) is not
   expanded: its value is the verifier's score of its completion, computed once, backed up again;
3. otherwise **expand**: E one-step samples of the leaf (identical step tokens merged, priors summed,
   see :func:`.tree.add_children`), then **evaluate every new child** and **back up** each
   child's value along root -> leaf -> child (one visit per evaluated child):

   * ``prm``: the aggregated PRM score of the child's whole prefix,
     ``aggregate(aggregation, PRM step scores)`` (``min`` by default; ``last`` gives the score of
     the new step alone). A terminal child gets the same score (the PRM is the verifier here).
   * ``rollout_orm``: K rollouts from the child to eos (temperature ``temperature``); each rollout
     is judged by the ORM (its score of the last step; a rollout cut short by the budget is judged
     as it is) and the child's value is the mean over its rollouts. Rollouts that ended (eos or
     the length cap) are kept as candidate answers. A terminal child is judged by the ORM directly.
   * ``rollout_oracle``: as ``rollout_orm`` but judged by the task's outcome checker (1/0): it
     reads the answer key, so it is an **upper bound**, not a test-time method.

   A child whose evaluation could not be paid for (budget) stays unvisited (``Q`` = its
   parent's ``Q`` in selection).

Every tree runs one simulation per round, in lockstep: one engine call for all trees'
expansions, one for all rollouts, one PRM/ORM call for all new children.

A tree stops after ``simulations`` simulations or when the budget cannot serve its expansion.

**Answer**: follow the most visited child from the root (:func:`.tree.most_visited_path`). At a
terminal node, its completion. Otherwise the best complete solution at or below the node reached
(terminal nodes and completed rollouts, by value; :func:`.tree.best_solution`), and without one,
the node's partial response continued greedily to eos with what is left of the budget.

**Budget** (:mod:`.expand`): before each round, a tree whose current answer would need that greedy
completion holds back its worst case, ``max_new_tokens - len(answer node)``, from expansions and
rollouts; an expansion or rollout is only sent if it can get ``min(min_request_tokens, room
left)`` tokens. Re-selecting a terminal costs no tokens but counts as a simulation.
"""

from __future__ import annotations

from collections.abc import Sequence

from creditrl.search.context import SearchContext
from creditrl.search.tree import Node, add_children, backup, best_solution, most_visited_path, select_leaf
from creditrl.search.verify import prefix_score


def answer_of(root: Node) -> tuple[Node, tuple[int, ...] | None]:
    """The node the answer rule reaches and the complete solution it gives (None: the node's
    partial response still needs a greedy completion)."""
    node = most_visited_path(root)[-1]
    if node.terminal:
        return node, node.tokens
    best = best_solution(node)
    return node, best[1] if best is not None else None


def _evaluate(ctx: SearchContext, new: Sequence[tuple[int, Node]], reserve: Sequence[int]) -> list[float | None]:
    """Leaf values of the new children ``(problem, node)`` (module docstring); None when unpaid."""
    cfg = ctx.cfg
    if cfg.leaf_value == "prm":
        scores = ctx.verify.prm_steps([(p, n.text) for p, n in new])
        for (_, node), s in zip(new, scores):
            node.step_scores = s
        return [prefix_score(cfg.aggregation, s) for s in scores]

    def judge(items: Sequence[tuple[int, str]]) -> list[float]:
        if cfg.leaf_value == "rollout_orm":
            return ctx.verify.orm_scores(items)
        return [float(ctx.verify.outcome(p, text)) for p, text in items]

    values: list[float | None] = [None] * len(new)
    terminal = [i for i, (_, n) in enumerate(new) if n.terminal]
    for i, v in zip(terminal, judge([(new[i][0], new[i][1].text) for i in terminal])):
        values[i] = v
    open_ = [i for i, (_, n) in enumerate(new) if not n.terminal]
    requests = [ctx.request(new[i][0], new[i][1].tokens) for i in open_ for _ in range(cfg.rollouts)]
    conts = ctx.gen.generate(requests, step=False, reserve=reserve, floor=cfg.min_request_tokens) if requests else []
    done = [
        (i, new[i][1].tokens + c.tokens, c.finished)
        for i, c in zip((i for i in open_ for _ in range(cfg.rollouts)), conts)
        if c is not None
    ]
    judged = judge([(new[i][0], ctx.text(tokens)) for i, tokens, _ in done])
    own: dict[int, list[float]] = {}
    for (i, tokens, finished), v in zip(done, judged):
        own.setdefault(i, []).append(v)
        if finished or len(tokens) >= cfg.max_new_tokens:  # complete: a candidate answer
            new[i][1].solutions.append((v, tokens))
    for i in open_:
        values[i] = sum(own[i]) / len(own[i]) if i in own else None
    return values


def grow_trees(ctx: SearchContext) -> list[Node]:
    """Run the simulations of every problem's tree in lockstep; returns the roots."""
    cfg = ctx.cfg
    n_problems = len(ctx.problems)
    roots = [Node() for _ in range(n_problems)]
    sims = [0] * n_problems
    active = set(range(n_problems))
    while active:
        order = sorted(active)
        reserve = [0] * n_problems
        for p in order:
            node, solution = answer_of(roots[p])
            reserve[p] = 0 if solution is not None else cfg.max_new_tokens - len(node.tokens)
        expanding: list[tuple[int, list[Node]]] = []
        for p in order:
            path = select_leaf(roots[p], cfg.c_puct)
            leaf = path[-1]
            if leaf.terminal:  # terminal children are always judged when created (no tokens needed)
                backup(path, leaf.evaluation)
            else:
                expanding.append((p, path))
        requests = [ctx.request(p, path[-1].tokens) for p, path in expanding for _ in range(cfg.expansions)]
        conts = ctx.gen.generate(requests, step=True, reserve=reserve, floor=cfg.min_request_tokens) if requests else []
        new: list[tuple[int, Node]] = []
        paths: list[list[Node]] = []
        for k, (p, path) in enumerate(expanding):
            mine = [c for c in conts[k * cfg.expansions : (k + 1) * cfg.expansions] if c is not None]
            if not mine:
                active.discard(p)  # the budget cannot pay for an expansion
                continue
            for child in add_children(
                path[-1], [(c.tokens, c.logprob, c.finished) for c in mine], max_len=cfg.max_new_tokens
            ):
                child.text = ctx.text(child.tokens)
                new.append((p, child))
                paths.append(path)
        for (_, child), path, value in zip(new, paths, _evaluate(ctx, new, reserve)):
            if value is not None:
                child.evaluation = value
                backup(path + [child], value)
        for p in order:
            sims[p] += 1
            if sims[p] >= cfg.simulations:
                active.discard(p)
    return roots


def run_mcts(ctx: SearchContext) -> list[tuple[int, ...]]:
    """MCTS on every problem in lockstep, then the answer rule; returns each problem's response tokens."""
    found = [answer_of(root) for root in grow_trees(ctx)]
    return ctx.finish([(node.tokens, False) if solution is None else (solution, True) for node, solution in found])
