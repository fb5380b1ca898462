"""Tests for the shortest-paths task (the second task): solutions, step truth, splits, config."""

from __future__ import annotations

import itertools

import pytest

from creditrl.config import load_config
from creditrl.config.loader import packaged_config
from creditrl.tasks.arithmetic import split_completion
from creditrl.tasks.base import Task, make_task
from creditrl.tasks.paths import PathsConfig, PathsTask, distances_to, parse_graph
from creditrl.train.resolve import build_task

TASK = PathsTask()
# A square a-b-d, a-c-d with a tail d-e: two shortest paths from a to e (abde, acde).
SQUARE = TASK.make_problem("ab,ac,bd,cd,de|a>e=")
T, F = True, False


def floyd_warshall(prompt: str) -> dict[tuple[str, str], int]:
    """All-pairs distances by relaxation: the slow reference for the breadth-first search."""
    graph, _, _ = parse_graph(prompt)
    nodes, inf = sorted(graph), 10**9
    d = {(u, v): 0 if u == v else (1 if v in graph[u] else inf) for u in nodes for v in nodes}
    for k, i, j in itertools.product(nodes, nodes, nodes):
        d[i, j] = min(d[i, j], d[i, k] + d[k, j])
    return d


def test_the_reference_solution_takes_the_alphabetically_first_right_move() -> None:
    assert (SQUARE.solution, SQUARE.answer, SQUARE.meta["n_ops"]) == ("ab;bd;de;#abde", "abde", 3)
    assert TASK.check_outcome(SQUARE, SQUARE.solution)
    assert TASK.label_completion(SQUARE, SQUARE.solution) == [T, T, T, T]
    assert TASK.first_error(SQUARE, SQUARE.solution) == "correct"


def test_every_shortest_path_is_right_and_a_longer_one_is_not() -> None:
    other = "ac;cd;de;#acde"
    assert TASK.check_outcome(SQUARE, other) and TASK.label_completion(SQUARE, other) == [T, T, T, T]
    longer = "ab;bd;dc;cd;de;#abdcde"  # follows edges, reaches the goal, one move too many
    assert not TASK.check_outcome(SQUARE, longer)
    assert TASK.label_completion(SQUARE, longer) == [T, T, F, F, F, F]
    assert TASK.first_error(SQUARE, longer) == "detour"


@pytest.mark.parametrize(
    ("completion", "labels", "error"),
    [
        ("bd;de;#abde", [F, F, T], "correct"),  # starts at b, not a; the outcome reads the answer only
        ("bd;de;#bde", [F, F, F], "wrong_start"),
        ("ae;#ae", [F, F], "not_an_edge"),
        ("ab;ba;ac;#abe", [T, F, F, F], "detour"),  # back to a: one farther from e
        ("ab;bd;de", [T, T, T], "wrong_answer"),  # every move right, no answer
        ("ab;bd;de;#abdd", [T, T, T, F], "wrong_answer"),
        ("ab;xyz;de;#abe", [T, F, F, F], "malformed"),
        ("ab;bd;de;#abde;#abde", [T, T, T, F], "wrong_answer"),  # the answer text runs to the end
        ("", [], "wrong_answer"),
    ],
)
def test_step_labels_stop_at_the_first_error(completion: str, labels: list[bool], error: str) -> None:
    assert TASK.label_completion(SQUARE, completion) == labels
    assert TASK.first_error(SQUARE, completion) == error


def test_a_second_answer_segment_is_wrong() -> None:
    assert TASK.check_steps(SQUARE, ["ab", "bd", "de", "#abde", "#abde"]) == [T, T, T, T, F]


def test_breadth_first_distances_match_floyd_warshall_on_sampled_graphs() -> None:
    task = PathsTask(nodes=9, extra_edges=4, min_dist=1, max_dist=5)
    for problem in task.sample(60, split="train", seed=3):
        graph, start, goal = parse_graph(problem.prompt)
        reference = floyd_warshall(problem.prompt)
        assert distances_to(graph, goal) == {u: reference[u, goal] for u in graph}
        assert problem.meta["n_ops"] == reference[start, goal] and 1 <= problem.meta["n_ops"] <= 5
        assert task.check_outcome(problem, problem.solution)
        assert all(task.label_completion(problem, problem.solution))


def test_sampled_graphs_are_connected_with_the_configured_edge_count() -> None:
    cfg = PathsConfig(nodes=10, extra_edges=4, min_dist=3, max_dist=5)
    for problem in PathsTask(cfg).sample(40, split="train", seed=0):
        edges = problem.prompt.split("|")[0].split(",")
        assert len(edges) == len(set(edges)) == cfg.nodes - 1 + cfg.extra_edges
        graph, start, goal = parse_graph(problem.prompt)
        assert len(distances_to(graph, goal)) == cfg.nodes  # every node reaches the goal
        assert 3 <= problem.meta["n_ops"] <= 5 and start != goal


def test_splits_are_deterministic_disjoint_and_follow_the_prompt_hash() -> None:
    train = TASK.sample(200, split="train", seed=1)
    assert [p.prompt for p in train] == [p.prompt for p in TASK.sample(200, split="train", seed=1)]
    heldout = TASK.sample(100, split="heldout", seed=1)
    assert {p.prompt for p in train}.isdisjoint(p.prompt for p in heldout)
    assert all(TASK.split_of(p.prompt) == "heldout" for p in heldout)
    assert all(p.meta["split"] == "train" for p in train)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 2}, "nodes must lie in [3, 26], got 2"),
        ({"nodes": 4, "extra_edges": 4}, "extra_edges must lie in [0, 3] for 4 nodes, got 4"),
        ({"min_dist": 0}, "min_dist must be >= 1, got 0"),
        ({"nodes": 5, "max_dist": 5}, "max_dist must lie in [min_dist (2), 4], got 5"),
        ({"heldout_mod": 1}, "heldout_mod must be >= 2, got 1"),
    ],
)
def test_config_errors_name_the_field_and_its_range(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        PathsConfig(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("ab,bc|a-c=", "not a paths prompt"),
        ("ab,cd|a>c=", "no path from 'a' to 'c'"),
        ("ab,bc|a>z=", "node 'z' is on no edge"),
    ],
)
def test_bad_prompts_are_rejected_with_a_reason(prompt: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TASK.make_problem(prompt)


def test_registered_and_built_from_the_packaged_config() -> None:
    task = make_task("paths", nodes=6, extra_edges=1, min_dist=1, max_dist=3)
    assert isinstance(task, PathsTask) and isinstance(task, Task) and task.config.nodes == 6
    cfg = load_config(packaged_config("paths"))
    built = build_task(cfg.task.name, cfg.task.args)
    assert isinstance(built, PathsTask) and built.config == PathsConfig(nodes=7, extra_edges=2, min_dist=2, max_dist=3)
    problem = built.sample(1, split="heldout", seed=0)[0]
    assert split_completion(problem.solution)[-1] == "#" + problem.answer
    assert len(problem.prompt) + len(problem.solution) < cfg.rollout.max_new_tokens + 80
