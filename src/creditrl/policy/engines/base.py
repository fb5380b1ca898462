"""The generation engine interface: sampling parameters, the generation record, the protocol every
engine implements, and the sampling helpers the in-process engines share.

Prompts (or any prefixes: a prompt plus part of a response) go in as token-id lists; ``n``
samples of each come out with their token ids and the log-probability of every sampled token
under the *policy* distribution (raw logits, temperature 1, no truncation) -- the distribution
the PPO loss differentiates, so the old-policy log-probs need no second forward pass.
Temperature and top-p shape only what is sampled.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from creditrl.policy.device import inference, module_device
from creditrl.policy.engines import kernels


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy decoding.

    ``stop_ids``: token ids that end a sample like eos does (the token is kept as its last
    token) without marking it ``finished``: step-level search and tree rollouts stop each
    continuation at the end of one reasoning step this way.
    """

    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.stop_ids, tuple) or not all(isinstance(t, int) and t >= 0 for t in self.stop_ids):
            raise ValueError(f"stop_ids must be a tuple of token ids >= 0, got {self.stop_ids!r}")


@dataclass
class Generation:
    """Samples for N = len(prompts) * n requests, prompt-major (all samples of prompt 0 first)."""

    prompt_index: list[int]  # (N,) index into the input prompts
    prompt_ids: list[list[int]]  # (N, *) the prefix each sample continued
    tokens: list[list[int]]  # (N, *) generated ids, ending with eos when ``finished``
    logprobs: list[list[float]]  # (N, *) log pi(token) under the raw policy distribution
    finished: list[bool]  # (N,) produced eos within max_new_tokens

    @classmethod
    def prompt_major(
        cls,
        n_prompts: int,
        n: int,
        requests: list[list[int]],
        tokens: list[list[int]],
        logprobs: list[list[float]],
        finished: list[bool],
    ) -> Generation:
        """The generation of ``n`` samples for each of ``n_prompts`` prompts, rows in request order."""
        return cls([i for i in range(n_prompts) for _ in range(n)], requests, tokens, logprobs, finished)


class GenerationEngine(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        budgets: Sequence[int] | None = None,
    ) -> Generation:
        """``budgets[i]`` (optional, >= 1) caps the new tokens of prompt i's samples below
        ``params.max_new_tokens`` (e.g. a continuation gets what its prefix left of a budget)."""
        ...


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into ``(ids, attention_mask)``, both (N, max_len)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on the first real token of each row (left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    draw_rows: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Pick one token per row from ``logits`` (N, V) with temperature and nucleus (top-p).

    Sampling is by inverse CDF: one uniform draw per row (``torch.multinomial`` would draw one
    per vocabulary entry), located in the row's cumulative distribution (accumulated in float64,
    so a token of probability p > 0 keeps an interval of width ~p). A token of probability 0 is
    never returned.

    ``draw_rows = (offset, total)``: these N rows are rows ``offset .. offset+N-1`` of a batch of
    ``total``; the full ``(total, 1)`` uniform vector is drawn and this slice used, so a worker
    that samples part of a batch consumes the generator exactly as the whole batch would.
    """
    if params.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    cdf = probs.double().cumsum(-1)
    u = uniforms(probs.shape[0], generator, draw_rows)
    u = u.to(cdf.device)[:, None] * cdf[:, -1:]  # drawn on the (CPU) generator: the same numbers on every device
    idx = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    # u * total can round up to total (probability ~1e-16): take the last token with mass
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1)
    return torch.minimum(idx, last)


def uniforms(rows: int, generator: torch.Generator | None, draw_rows: tuple[int, int] | None = None) -> torch.Tensor:
    """The (rows,) float64 uniforms of one sampling step (see :func:`sample_next`'s ``draw_rows``)."""
    if draw_rows is None:
        return torch.rand(rows, 1, generator=generator, dtype=torch.float64)[:, 0]
    offset, total = draw_rows
    if offset < 0 or offset + rows > total:
        raise ValueError(f"draw_rows={draw_rows}: rows {offset}..{offset + rows - 1} are not within {total}")
    return torch.rand(total, 1, generator=generator, dtype=torch.float64)[offset : offset + rows, 0]


def sample_step(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    state: tuple[torch.Tensor, torch.Tensor],
    limit: torch.Tensor,
    step: int,
    *,
    pad_id: int,
    eos_id: int,
    draw_rows: tuple[int, int] | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One decode step's draw for every request, shared by the engines so that they consume the
    generator identically: one draw per request per step, also for requests already done (their
    stale logits are sampled and the token replaced by pad), so the random stream does not depend
    on when rows leave the batch. ``state`` is ``(finished, done)``: ended with eos, and ended (eos
    or a ``params.stop_ids`` token) or out of budget. Returns the tokens, their log-probs under the
    raw policy and the new state. ``draw_rows``: see :func:`sample_next`. ``compiled``: draw and
    log-prob in one compiled pass (:func:`creditrl.policy.engines.kernels.sample_tokens`; float32
    CPU logits, temperature > 0, no top-p), else tensor ops."""
    finished, done = state
    if compiled and params.temperature > 0 and params.top_p >= 1.0:
        u = uniforms(logits.shape[0], generator, draw_rows)
        tok, logp = kernels.sample_tokens(logits, params.temperature, u, done, pad_id)
    else:
        tok = sample_next(logits, params, generator, draw_rows)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
    eos = (tok == eos_id) & ~done
    stops = torch.tensor(params.stop_ids, dtype=tok.dtype, device=tok.device)
    ended = eos | (torch.isin(tok, stops) & ~done) if params.stop_ids else eos
    return tok, logp, (finished | eos, done | ended | (limit <= step + 1))


def expand_requests(
    prompts: Sequence[Sequence[int]], n: int, params: SamplingParams, budgets: Sequence[int] | None
) -> tuple[list[list[int]], torch.Tensor]:
    """Validate a ``generate`` call; the prompt-major request list (each prompt ``n`` times) and
    each request's new-token limit (its prompt's budget, at most ``max_new_tokens``)."""
    if n < 1 or not prompts:
        raise ValueError(f"need at least one prompt and n >= 1, got {len(prompts)} prompts, n={n}")
    if budgets is not None and (len(budgets) != len(prompts) or min(budgets) < 1):
        raise ValueError(f"budgets: need one budget >= 1 per prompt ({len(prompts)}), got {list(budgets)}")
    requests = [list(p) for p in prompts for _ in range(n)]
    if any(len(p) == 0 for p in requests):
        raise ValueError("every prompt needs at least one token (e.g. bos)")
    cap = params.max_new_tokens
    limit = (
        torch.tensor([min(cap, b) for b in budgets for _ in range(n)]) if budgets else torch.full((len(requests),), cap)
    )
    return requests, limit


def generate_chunked(
    engine: InProcessEngine,
    prompts: Sequence[Sequence[int]],
    n: int,
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
    budgets: Sequence[int] | None = None,
    max_rows: int,
    max_positions: int | None = None,
) -> Generation:
    """``engine.generate(prompts, n, params, ...)`` in calls of at most ``max_rows`` request rows
    (an engine holds a KV cache per row), sampling what the single call samples. ``max_positions``
    also bounds each call's padded cache, ``rows x (longest request + largest new-token limit)``
    (a call holds one row at least, whatever its length).

    Every chunk starts from the generator's state and draws the whole batch's uniforms each step,
    using its own rows' (``draw_rows``); afterwards the generator is advanced by the single call's
    draws (:func:`advance_generator`). Tokens are those of the single call, unless a smaller
    batch's matrix products round a log-prob across a sampling boundary (float rounding only).
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if max_positions is not None and max_positions < 1:
        raise ValueError(f"max_positions must be >= 1 or None, got {max_positions}")
    requests, limit = expand_requests(prompts, n, params, budgets)
    total = len(requests)
    limits = limit.tolist()
    spans = _row_spans([len(r) for r in requests], limits, max_rows, max_positions)
    if len(spans) == 1:
        return engine.generate(prompts, n, params, generator=generator, budgets=budgets)
    gen = generator if generator is not None else torch.default_generator
    state = gen.get_state()
    tokens, logprobs, finished = [], [], []
    for a, b in spans:
        part = torch.Generator().set_state(state.clone())
        out = engine.generate(requests[a:b], 1, params, generator=part, budgets=limits[a:b], draw_rows=(a, total))
        tokens += out.tokens
        logprobs += out.logprobs
        finished += out.finished
    advance_generator(gen, total, tokens, params)
    return Generation.prompt_major(len(prompts), n, requests, tokens, logprobs, finished)


def _row_spans(
    lengths: list[int], limits: list[int], max_rows: int, max_positions: int | None
) -> list[tuple[int, int]]:
    """Consecutive row ranges ``[a, b)`` of at most ``max_rows`` rows whose padded cache
    ``(b - a) * (max(lengths[a:b]) + max(limits[a:b]))`` stays within ``max_positions`` (a range of
    one row may exceed it)."""
    spans, a = [], 0
    while a < len(lengths):
        b, longest, limit = a, 0, 0
        while b < len(lengths) and b - a < max_rows:
            longest, limit = max(longest, lengths[b]), max(limit, limits[b])
            if max_positions is not None and b > a and (b + 1 - a) * (longest + limit) > max_positions:
                break
            b += 1
        spans.append((a, b))
        a = b
    return spans


def advance_generator(
    generator: torch.Generator, total: int, tokens: Sequence[Sequence[int]], params: SamplingParams
) -> None:
    """Advance ``generator`` as one in-process ``generate`` call of ``total`` rows that produced
    ``tokens`` would have: one ``(total, 1)`` uniform draw per decode step, as many steps as the
    longest row (none at temperature 0)."""
    if params.temperature > 0:
        for _ in range(max((len(t) for t in tokens), default=0)):
            torch.rand(total, 1, generator=generator, dtype=torch.float64)


def cut_row(
    tokens: list[int], logprobs: list[float], limit: int, eos_id: int, stop_ids: tuple[int, ...]
) -> tuple[list[int], list[float], bool]:
    """A sampled row cut at ``limit`` tokens and after its first eos or stop token, and whether it
    ended with eos (``finished``)."""
    tokens = tokens[:limit]
    length = next((i + 1 for i, t in enumerate(tokens) if t == eos_id or t in stop_ids), len(tokens))
    return tokens[:length], logprobs[:length], length > 0 and tokens[length - 1] == eos_id


class InProcessEngine(ABC):
    """What the in-process engines share: ``generate`` validates the call, runs the engine's
    decode loop in ``grad_mode`` (no gradients) under ``policy.precision`` autocast on the
    model's device, and cuts the sampled rows into a :class:`Generation`."""

    # no_grad, not inference_mode, for HF models: a buffer a model creates lazily during generation
    # (e.g. a rotary cache) would otherwise become an inference tensor the next backward rejects
    grad_mode: type = torch.no_grad

    def __init__(self, model: PreTrainedModel, *, eos_id: int, pad_id: int, precision: str = "fp32") -> None:
        self.model = model
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.precision = precision  # policy.precision: the forward passes run under autocast

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        budgets: Sequence[int] | None = None,
        draw_rows: tuple[int, int] | None = None,
    ) -> Generation:
        """``draw_rows = (offset, total)``: these requests are rows ``offset..`` of a larger
        batch of ``total`` requests, and each step draws that batch's random numbers (a
        distributed worker's share of a batch, see :func:`sample_next`). The returned
        generation is plain Python data, whatever the model's device."""
        requests, limit = expand_requests(prompts, n, params, budgets)
        with self.grad_mode(), inference(module_device(self.model), self.precision):
            tokens, logps = self._decode(requests, limit, params, generator, draw_rows)
        rows = zip(tokens.tolist(), logps.tolist(), limit.tolist())
        cut = [cut_row(t, lp, lim, self.eos_id, params.stop_ids) for t, lp, lim in rows]
        return Generation.prompt_major(len(prompts), n, requests, *map(list, zip(*cut)))

    @abstractmethod
    def _decode(
        self,
        requests: list[list[int]],
        limit: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        draw_rows: tuple[int, int] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's sampling loop over the request rows of :func:`expand_requests` and their
        new-token ``limit`` (N,): the sampled tokens and their log-probs, (N, steps) on the CPU."""
