"""What every search method works with: the problems, the budgeted generator and the verifier."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from creditrl.config import SearchConfig
from creditrl.policy.tokenizer import decode_response
from creditrl.search.expand import BudgetedGenerator, Request
from creditrl.search.verify import Verifier
from creditrl.tasks.base import Problem


@dataclass
class SearchContext:
    problems: list[Problem]
    cfg: SearchConfig
    tokenizer: PreTrainedTokenizerBase
    gen: BudgetedGenerator
    verify: Verifier

    def text(self, tokens: Sequence[int]) -> str:
        """A response's text (special tokens such as eos dropped)."""
        return decode_response(self.tokenizer, list(tokens))

    def complete_greedily(self, items: Sequence[tuple[int, tuple[int, ...]]]) -> list[tuple[int, ...]]:
        """Each ``(problem, partial response)`` continued greedily to eos in one batched call,
        within the response length cap and what is left of the problem's budget (it may stop
        short); returns the full response tokens."""
        requests = [Request(p, tokens, self.cfg.max_new_tokens - len(tokens)) for p, tokens in items]
        conts = self.gen.generate(requests, step=False, greedy=True)
        return [tokens + (c.tokens if c is not None else ()) for (_, tokens), c in zip(items, conts)]
