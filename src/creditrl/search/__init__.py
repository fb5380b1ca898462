"""Test-time search over reasoning steps: greedy, best-of-N, PRM-guided beam search and MCTS,
all under one per-problem budget of generated tokens (``creditrl search``)."""

import typing

from creditrl.config import SearchConfig
from creditrl.config.types import SearchMethod
from creditrl.search.expand import BudgetedGenerator, Continuation, Request, water_fill
from creditrl.search.methods import (
    METHODS,
    ProblemResult,
    Sampled,
    SearchResult,
    make_context,
    sample_candidates,
    search,
)
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
from creditrl.search.verify import Verifier, prefix_score

METHOD_NAMES = typing.get_args(SearchMethod)  # the keys of METHODS

__all__ = [
    "METHOD_NAMES",
    "METHODS",
    "BudgetedGenerator",
    "Continuation",
    "Node",
    "ProblemResult",
    "Request",
    "Sampled",
    "SearchConfig",
    "SearchResult",
    "Verifier",
    "add_children",
    "backup",
    "best_solution",
    "make_context",
    "most_visited_path",
    "prefix_score",
    "puct_scores",
    "sample_candidates",
    "search",
    "select_child",
    "select_leaf",
    "water_fill",
]
