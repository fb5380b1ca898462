"""Shortest paths in small graphs: a planning task whose steps are not a chain of computations.

A problem lists the edges of an undirected graph on the nodes ``a, b, ...`` and asks for a
shortest path between two of them::

    "ab,ac,bd,cd,de,df|a>e="  ->  "ab;bd;de;#abde"

Each step is one move, written as the two nodes it joins (``"bd"``); the steps are joined with
``";"`` and the completion ends with ``"#"`` and the path as a string of nodes. The outcome is
right when that path starts and ends at the asked nodes, follows edges of the graph and is as
short as the breadth-first distance. A step is right when it leaves the node the path has
reached, follows an edge, lands one closer to the goal (so it lies on *some* shortest path), and
every earlier step was right (stop at the first error).

The step truth is known exactly, but a right step needs the whole graph rather than the previous
line (a planning decision, not a local computation), and is often one of several right ones, so
there is no single canonical solution for dense credit to copy. The reference solution for SFT
takes the alphabetically first right move at each node. Held-out problems are those whose prompt
hashes to 0 modulo ``heldout_mod``.
"""

from __future__ import annotations

import random
import re
import string
from collections import deque
from dataclasses import dataclass

from creditrl.tasks.arithmetic import StepTask, normalise_step, split_completion
from creditrl.tasks.base import Drawn, Problem, register_task

__all__ = ["PathsConfig", "PathsTask", "parse_graph", "distances_to"]

_PROMPT_RE = re.compile(r"((?:[a-z]{2},)*[a-z]{2})\|([a-z])>([a-z])=?")
Graph = dict[str, set[str]]


@dataclass(frozen=True)
class PathsConfig:
    """Distribution of shortest-path problems.

    Attributes:
        nodes: Nodes per graph, named ``a`` onwards (3 to 26).
        extra_edges: Edges added to a random spanning tree (>= 0); more edges, more branches.
        min_dist: Shortest asked distance (>= 1).
        max_dist: Longest asked distance (min_dist <= max_dist < nodes).
        heldout_mod: A prompt is held out iff its SHA-256 (as an integer) is divisible by
            ``heldout_mod`` (>= 2).
    """

    nodes: int = 8
    extra_edges: int = 3
    min_dist: int = 2
    max_dist: int = 4
    heldout_mod: int = 10

    def __post_init__(self) -> None:
        """Reject out-of-range fields with a ValueError naming the field and its allowed range."""
        if not 3 <= self.nodes <= 26:
            raise ValueError(f"nodes must lie in [3, 26], got {self.nodes}")
        most = self.nodes * (self.nodes - 1) // 2 - (self.nodes - 1)
        if not 0 <= self.extra_edges <= most:
            raise ValueError(f"extra_edges must lie in [0, {most}] for {self.nodes} nodes, got {self.extra_edges}")
        if self.min_dist < 1:
            raise ValueError(f"min_dist must be >= 1, got {self.min_dist}")
        if not self.min_dist <= self.max_dist < self.nodes:
            far = self.nodes - 1
            raise ValueError(f"max_dist must lie in [min_dist ({self.min_dist}), {far}], got {self.max_dist}")
        if self.heldout_mod < 2:
            raise ValueError(f"heldout_mod must be >= 2, got {self.heldout_mod}")


def parse_graph(prompt: str) -> tuple[Graph, str, str]:
    """The adjacency sets, start and goal of a prompt such as ``"ab,bc|a>c="``."""
    m = _PROMPT_RE.fullmatch(prompt)
    if m is None:
        raise ValueError(f"not a paths prompt (expected edges like 'ab,bc', '|', 'a>c' and '='): {prompt!r}")
    edges, start, goal = m.groups()
    graph: Graph = {}
    for u, v in edges.split(","):
        graph.setdefault(u, set()).add(v)
        graph.setdefault(v, set()).add(u)
    for node in (start, goal):
        if node not in graph:
            raise ValueError(f"node {node!r} is on no edge of {prompt!r}")
    return graph, start, goal


def distances_to(graph: Graph, goal: str) -> dict[str, int]:
    """Breadth-first distance from every node that reaches ``goal`` to ``goal``."""
    dist, queue = {goal: 0}, deque([goal])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.get(node, ())):
            if nxt not in dist:
                dist[nxt] = dist[node] + 1
                queue.append(nxt)
    return dist


def _random_graph(rng: random.Random, cfg: PathsConfig) -> list[str]:
    """A connected graph on ``cfg.nodes`` nodes as sorted edge names: a random spanning tree
    (each node joins an earlier one) plus ``cfg.extra_edges`` distinct random edges."""
    names = list(string.ascii_lowercase[: cfg.nodes])
    order = names[:]
    rng.shuffle(order)
    edges = {"".join(sorted((order[i], order[rng.randrange(i)]))) for i in range(1, cfg.nodes)}
    absent = sorted({u + v for i, u in enumerate(names) for v in names[i + 1 :]} - edges)
    edges |= set(rng.sample(absent, cfg.extra_edges))
    listed = sorted(edges)
    rng.shuffle(listed)
    return listed


@register_task("paths")
class PathsTask(StepTask):
    """Shortest paths in small random graphs (registry name ``"paths"``, step separator ``";"``)."""

    name: str = "paths"
    error_kinds: tuple[str, ...] = ("correct", "wrong_start", "not_an_edge", "detour", "malformed", "wrong_answer")
    config_type = PathsConfig
    config: PathsConfig

    def make_problem(self, prompt: str) -> Problem:
        """The problem of a prompt such as ``"ab,bc|a>c="`` (the ``"="`` may be left out)."""
        prompt = prompt.removesuffix("=") + "="
        graph, start, goal = parse_graph(prompt)
        dist = distances_to(graph, goal)
        if start not in dist:
            raise ValueError(f"no path from {start!r} to {goal!r} in {prompt!r}")
        path = [start]
        while path[-1] != goal:
            path.append(min(n for n in graph[path[-1]] if dist.get(n) == dist[path[-1]] - 1))
        return self._problem(prompt, [a + b for a, b in zip(path, path[1:])], "".join(path))

    def sample(self, n: int, *, split: str, seed: int) -> list[Problem]:
        """``n`` problems of ``split``, deterministic for a given (config, split, seed); duplicates may occur."""
        cfg = self.config

        def draw(rng: random.Random) -> Drawn | None:
            edges = _random_graph(rng, cfg)
            start, goal = rng.sample(string.ascii_lowercase[: cfg.nodes], 2)
            prompt = f"{','.join(edges)}|{start}>{goal}="
            far = distances_to(parse_graph(prompt)[0], goal)[start]
            return (prompt, lambda: self.make_problem(prompt)) if cfg.min_dist <= far <= cfg.max_dist else None

        return self._sample(n, split, seed, draw, space=f" for {cfg}")

    def check_outcome(self, problem: Problem, completion: str) -> bool:
        """Whether the path after the first ``"#"`` is a shortest path from the start to the goal."""
        path = self.extract_answer(completion)
        if not path:
            return False
        graph, start, goal = parse_graph(problem.prompt)
        follows = all(b in graph.get(a, ()) for a, b in zip(path, path[1:]))
        return follows and path[0] == start and path[-1] == goal and len(path) - 1 == distances_to(graph, goal)[start]

    def _judge(self, problem: Problem, segments: list[str]) -> list[str]:
        """One error kind per segment (:attr:`error_kinds`), stopping at the first error: every
        segment after a wrong one, or after the first answer, is ``"malformed"``."""
        graph, start, goal = parse_graph(problem.prompt)
        dist = distances_to(graph, goal)
        kinds, here, failed, answered = [], start, False, False
        for segment in segments:
            text = normalise_step(segment)
            if text.startswith("#"):
                kind = "correct" if not answered and self.check_outcome(problem, text) else "wrong_answer"
                answered = True
            elif failed or answered or not re.fullmatch(r"[a-z]{2}", text):
                kind = "malformed"
            elif text[0] != here:
                kind = "wrong_start"
            elif text[1] not in graph.get(here, ()):
                kind = "not_an_edge"
            elif dist.get(text[1], -1) != dist[here] - 1:
                kind = "detour"
            else:
                kind, here = "correct", text[1]
            failed = failed or (kind != "correct" and not text.startswith("#"))
            kinds.append(kind)
        return kinds

    def check_steps(self, problem: Problem, segments: list[str]) -> list[bool]:
        """One label per segment: a move is right iff it leaves the node reached so far, follows an
        edge and lands one closer to the goal, and every earlier move was right; the answer
        segment iff it is the first answer segment and :meth:`check_outcome` holds."""
        return [kind == "correct" for kind in self._judge(problem, segments)]

    def first_error(self, problem: Problem, completion: str) -> str:
        """Where ``completion`` goes wrong (one of :attr:`error_kinds`): at its first wrong move, a
        move from the wrong node (``wrong_start``), along no edge (``not_an_edge``), away from the
        goal (``detour``) or other text (``malformed``); ``wrong_answer`` when no move is wrong."""
        if self.check_outcome(problem, completion):
            return "correct"
        for kind in self._judge(problem, split_completion(completion)):
            if kind not in ("correct", "wrong_answer"):
                return kind
        return "wrong_answer"
