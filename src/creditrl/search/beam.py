"""PRM-guided step-level beam search (Snell et al. 2024, arXiv:2408.03314, section 5).

Per problem, a beam of at most W live partial solutions starts as the bare prompt. Each round:

1. every live beam is continued by E independent one-step samples from the policy (the engine
   stops each sample right after the step separator, or at eos);
2. identical children of one problem (same response tokens) are merged;
3. every child is scored by the PRM: ``score = aggregate(aggregation, PRM step scores so far)``
   (``min`` by default; :func:`creditrl.prm.metrics.aggregate_steps`);
4. children that ended with eos move to the finished pool; children that reached the response
   length cap without eos can go no further and are kept aside as partials; the W best remaining
   children by score (ties: first sampled) form the next beam.

A problem stops when its finished pool holds W candidates, when no live beam is left, or when the
budget cannot serve any of its requests. Answer: the best finished candidate by the same score
(ties: the first to finish); without one, the best partial (last live beam and length-capped
children) by score, continued greedily to eos with what is left of the budget.

Budget (:mod:`.expand`): while no candidate has finished, each round holds back
``max_new_tokens - len(best live beam)`` tokens (the worst case of that final greedy completion)
from the expansions. An expansion is only sent if it can get ``min(min_request_tokens, room
left)`` tokens (the last ones are dropped first).

With W = E = 1 at temperature 0 this is greedy decoding, one step per engine call: the same
tokens as one greedy completion (up to float rounding between prefill and cached decoding).
"""

from __future__ import annotations

from creditrl.search.context import SearchContext
from creditrl.search.tree import Node
from creditrl.search.verify import prefix_score


def run_beam(ctx: SearchContext) -> list[tuple[int, ...]]:
    """Beam search on every problem in lockstep (one engine call and one PRM call per round);
    returns each problem's response tokens."""
    cfg = ctx.cfg
    n_problems = len(ctx.problems)
    beams: list[list[tuple[float, Node]]] = [[(0.0, Node())] for _ in range(n_problems)]
    finished: list[list[tuple[float, Node]]] = [[] for _ in range(n_problems)]
    capped: list[list[tuple[float, Node]]] = [[] for _ in range(n_problems)]
    active = set(range(n_problems))
    while active:
        order = sorted(active)
        reserve = [0] * n_problems
        for p in order:
            if not finished[p]:
                best = max(beams[p], key=lambda sn: sn[0])[1]
                reserve[p] = cfg.max_new_tokens - len(best.tokens)
        requests, parents = [], []
        for p in order:
            for _, node in beams[p]:
                for _ in range(cfg.expansions):
                    requests.append(ctx.request(p, node.tokens))
                    parents.append(node)
        conts = ctx.gen.generate(requests, step=True, reserve=reserve, floor=cfg.min_request_tokens)
        children: dict[int, dict[tuple[int, ...], Node]] = {p: {} for p in order}
        for r, parent, c in zip(requests, parents, conts):
            if c is None:
                continue
            tokens = parent.tokens + c.tokens
            if tokens not in children[r.problem]:
                children[r.problem][tokens] = Node(
                    tokens=tokens,
                    parent=parent,
                    finished=c.finished,
                    terminal=c.finished or len(tokens) >= cfg.max_new_tokens,
                    text=ctx.text(tokens),
                )
        new = [(p, node) for p in order for node in children[p].values()]
        for (_, node), scores in zip(new, ctx.verify.prm_steps([(p, n.text) for p, n in new])):
            node.step_scores = scores
        for p in order:
            if not children[p]:
                active.discard(p)  # nothing could be paid for
                continue
            pool = []
            for node in children[p].values():
                scored = (prefix_score(cfg.aggregation, node.step_scores), node)
                (finished[p] if node.finished else capped[p] if node.terminal else pool).append(scored)
            beams[p] = sorted(pool, key=lambda sn: -sn[0])[: cfg.width]  # stable: ties keep sample order
            if len(finished[p]) >= cfg.width or not beams[p]:
                active.discard(p)
    best = [max(finished[p] or beams[p] + capped[p], key=lambda sn: sn[0])[1] for p in range(n_problems)]
    return ctx.finish([(node.tokens, node.finished) for node in best])
