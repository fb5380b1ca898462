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

    def request(self, problem: int, tokens: tuple[int, ...]) -> Request:
        """Continue ``problem``'s partial response ``tokens`` up to the response length cap."""
        return Request(problem, tokens, self.cfg.max_new_tokens - len(tokens))

    def complete_greedily(self, items: Sequence[tuple[int, tuple[int, ...]]]) -> list[tuple[int, ...]]:
        """Each ``(problem, partial response)`` continued greedily to eos in one batched call,
        within the response length cap and what is left of the problem's budget (it may stop
        short); returns the full response tokens."""
        conts = self.gen.generate([self.request(p, tokens) for p, tokens in items], step=False, greedy=True)
        return [tokens + (c.tokens if c is not None else ()) for (_, tokens), c in zip(items, conts)]

    def finish(self, responses: Sequence[tuple[tuple[int, ...], bool]]) -> list[tuple[int, ...]]:
        """Per problem ``(response tokens, complete)``: the complete ones as they are, the others
        through :meth:`complete_greedily`, all in one call."""
        todo = [(p, tokens) for p, (tokens, complete) in enumerate(responses) if not complete]
        done = iter(self.complete_greedily(todo) if todo else [])
        return [tokens if complete else next(done) for tokens, complete in responses]
