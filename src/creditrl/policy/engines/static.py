"""A generation engine without per-step framework overhead: a pre-allocated KV cache and a
functional decoder forward over the HF model's own weights.

Decoding a small model through ``model(...)`` on the CPU spends most of each step on framework
overhead (mask building, growing cache objects, module calls) rather than on the matrix products.
:class:`StaticEngine` runs the same mathematics as the HF modules -- RMSNorm, rotary embeddings
from the model's own rotary module, grouped-query attention, gated MLP -- as a short sequence of
tensor ops over fused weights (``q|k|v`` and ``gate|up``;
:class:`~creditrl.policy.engines.decoder.Decoder`), with keys and values in tensors allocated
once per call (:mod:`creditrl.policy.engines.kv_cache`). This module is the sampling loop:

* **pre-allocated KV cache**: keys and values in tensors allocated once per call, a slot per
  distinct sequence; decode step j writes response column j (layouts:
  :mod:`creditrl.policy.engines.kv_cache`, chosen by :meth:`StaticEngine.rows_layout`);
* **shared-prefix prefill**: identical prompts (the ``n`` samples of a prompt, MC continuations
  of one prefix) run through the prompt forward once and their keys/values are copied;
* **early exit**: finished rows are compacted out of the cache once they are a quarter of it;
* **identical rows decoded once** (``share_rows``, :class:`~creditrl.policy.engines.kv_cache.Slots`):
  the samples of a prompt are one sequence until they draw different tokens, and a confident
  policy keeps many of them identical for long stretches; the decode step runs once per distinct
  sequence. Tokens and log-probs are those of decoding every row (tested,
  ``benchmarks/logprob_agreement.py``); ``share_rows=False`` decodes every row;
* **compiled decode step** (``kernels``, ``policy.kernels``; float32): rotary embedding, cache
  write and attention of a layer in one numba pass, RMSNorm in one pass, residual adds folded
  into ``addmm``, the sampling draw with its log-prob in one pass
  (:mod:`creditrl.policy.engines.kernels`); ``kernels="torch"`` keeps every step in tensor ops;
* **oneDNN products** (``products``): from a hidden size of
  :data:`~creditrl.policy.engines.decoder.ONEDNN_FROM_HIDDEN` the compiled step's products run
  through oneDNN's linear on weights reordered once per call, with the residual add as its
  post-op.

Sampling consumes the generator exactly like :class:`~creditrl.policy.engines.hf.HFEngine` (one
draw per request per step), so both engines give the same tokens for the same seed up to float
rounding. Supported architectures: Llama, Mistral (within its sliding window), Qwen2 and Qwen3;
:func:`~creditrl.policy.engines.select.make_engine` falls back to
:class:`~creditrl.policy.engines.hf.HFEngine` for anything else.
"""

from __future__ import annotations

import functools
import typing

import torch
from transformers import PreTrainedModel

from creditrl.config.types import Kernels
from creditrl.policy.engines import kernels as compiled
from creditrl.policy.engines.base import InProcessEngine, SamplingParams, left_pad, positions_from_mask, sample_step
from creditrl.policy.engines.decoder import ONEDNN_FROM_HIDDEN, Decoder, onednn_available, unsupported_reason
from creditrl.policy.engines.kv_cache import RowsCache, SharedCache, Slots, TensorCache, take

KERNELS = typing.get_args(Kernels)  # the decode step (policy.kernels): auto = numba in fp32 when importable
PRODUCTS = ("auto", "torch", "onednn")  # the compiled step's products; see StaticEngine.use_onednn
CACHE_LAYOUTS = ("auto", "rows", "shared")  # the compiled kernels' KV cache; see StaticEngine.rows_layout
ROWS_LAYOUT_MAX_READ = 2.0
SHARED_LAYOUT_BELOW = 0.6  # share of row-steps computed in the last call (StaticEngine.rows_layout)


class StaticEngine(InProcessEngine):
    """Fast batched sampling for Llama-family HF models on the CPU (see the module docstring)."""

    grad_mode = torch.inference_mode  # plain tensor ops on read-only weights: nothing for autograd

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_id: int,
        pad_id: int,
        compact_at: float = 0.75,
        precision: str = "fp32",
        kernels: str = "auto",
        cache_layout: str = "auto",
        share_rows: bool = True,
        products: str = "auto",
    ) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"StaticEngine cannot run this model: {reason}")
        if not 0 < compact_at <= 1:
            raise ValueError(f"compact_at must be in (0, 1], got {compact_at}")
        if kernels not in KERNELS:
            raise ValueError(f"kernels: expected one of {KERNELS}, got '{kernels}'")
        if cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"cache_layout: expected one of {CACHE_LAYOUTS}, got '{cache_layout}'")
        if products not in PRODUCTS:
            raise ValueError(f"products: expected one of {PRODUCTS}, got '{products}'")
        if products == "onednn" and not onednn_available():
            raise ValueError("products='onednn' needs a torch built with oneDNN (torch.backends.mkldnn)")
        if kernels == "numba" and not compiled.available():
            raise ValueError("kernels='numba' needs numba, which cannot be imported here (pip install numba)")
        super().__init__(model, eos_id=eos_id, pad_id=pad_id, precision=precision)
        self.compact_at = compact_at
        self.kernels = kernels
        self.cache_layout = cache_layout
        self.share_rows = share_rows  # one cache slot and one decode per distinct sequence (kv_cache.Slots)
        self.products = products
        self.last_rows: tuple[int, int] = (0, 0)  # last call: (slot-steps computed, row-steps decoded)

    def rows_layout(self, rows: int, prompts: int, width: int, steps: int) -> bool:
        """Whether the compiled kernels keep the KV cache rows innermost, ``(kv, prompt + response
        columns, d, rows)`` with each row's own copy of its prompt's keys, rather than
        ``shared``: the prompt keys once per distinct prompt and the response keys per row,
        attended per (row, head). The rows layout reads its cache in one vectorised stream per
        head and is the faster per key read, but it reads (and holds) every prompt once per row;
        ``auto`` takes it while that is at most ``ROWS_LAYOUT_MAX_READ`` times the keys sharing
        reads over a call (long prefixes continued many times, as MC continuations are, exceed it).

        With ``share_rows``, ``auto`` also takes ``shared`` when the engine's last call computed
        at most ``SHARED_LAYOUT_BELOW`` of its row-steps (:attr:`last_rows`): a policy that keeps
        its samples identical keeps doing so from one call to the next, and few slots attended per
        (slot, head) then beat the rows layout's vectors over a partly filled row axis."""
        if self.cache_layout != "auto":
            return self.cache_layout == "rows"
        computed, decoded = self.last_rows
        if self.share_rows and decoded and computed <= SHARED_LAYOUT_BELOW * decoded:
            return False
        copied = rows * (width + steps / 2)
        shared = prompts * width + rows * steps / 2
        return copied <= ROWS_LAYOUT_MAX_READ * shared

    def use_onednn(self, hidden_size: int) -> bool:
        """Whether the compiled decode step runs its products through oneDNN on weights reordered
        once per call (:meth:`~creditrl.policy.engines.decoder.Decoder.prepack`) rather than torch's
        ``F.linear``: ``auto`` from :data:`~creditrl.policy.engines.decoder.ONEDNN_FROM_HIDDEN` on."""
        if self.products == "auto":
            return hidden_size >= ONEDNN_FROM_HIDDEN and onednn_available()
        return self.products == "onednn"

    def _use_kernels(self, dtype: torch.dtype) -> bool:
        """Decode through the compiled kernels: float32 only (fp32 weights, no autocast)."""
        if self.kernels == "torch":
            return False
        fp32 = dtype == torch.float32 and self.precision == "fp32"
        if self.kernels == "numba" and not fp32:
            raise ValueError(f"kernels='numba' runs float32 only (weights {dtype}, policy.precision {self.precision})")
        return fp32 and compiled.available()

    def _decode(
        self,
        requests: list[list[int]],
        limit: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        draw_rows: tuple[int, int] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dec = Decoder(self.model)  # weights are read afresh: the policy changes between calls
        n_req = len(requests)
        steps = int(limit.max())

        # Shared-prefix prefill: one forward per distinct prompt.
        uniq: dict[tuple[int, ...], int] = {}
        prompt_of = torch.tensor([uniq.setdefault(tuple(p), len(uniq)) for p in requests])  # (n_req,)
        width = max(len(p) for p in uniq)
        longest = max(len(p) for p in requests) + steps - 1  # the last sampled token is never fed back
        if dec.window is not None and longest > dec.window:
            raise ValueError(f"sequence length {longest} exceeds Mistral sliding_window={dec.window}; use engine 'hf'")
        cos_t, sin_t = dec.rope_table(width + steps)
        plogits, prefix, attn, pos = prefill(dec, [list(p) for p in uniq], self.pad_id, cos_t, sin_t)
        dtype = dec.embed.dtype
        fused = self._use_kernels(dtype)
        whole = fused and dec.fusable  # the whole decode step through the kernels
        if whole and self.use_onednn(dec.hidden_size):
            dec.prepack(n_req)
        slots = Slots(prompt_of, self.share_rows, compiled_step=compiled.available())
        innermost = fused and self.rows_layout(n_req, len(uniq), width, steps)
        cache = RowsCache if innermost else SharedCache if fused else TensorCache
        kv = cache(dec, prefix, attn, slots.prompt, steps, n_req)
        slot_pos = torch.zeros(n_req, dtype=torch.long)  # each slot's next position
        slot_pos[: slots.n] = pos[slots.prompt, -1] + 1
        logits = plogits[prompt_of].float()  # float32 also under bf16/fp16 autocast (policy.precision)

        state = (torch.zeros(n_req, dtype=torch.bool),) * 2  # (finished, done)
        active = torch.arange(n_req)  # requests whose rows are in the cache, in cache order
        tokens = torch.full((n_req, steps), self.pad_id, dtype=torch.long)
        logps = torch.zeros(n_req, steps)
        sample = functools.partial(
            sample_step, pad_id=self.pad_id, eos_id=self.eos_id, draw_rows=draw_rows, compiled=fused
        )
        for step in range(steps):
            tok, logps[:, step], state = sample(logits, params, generator, state, limit, step)
            tokens[:, step] = tok
            done = state[1]
            if bool(done.all()):
                break
            live = ~done[active]
            n_live = int(live.sum())
            if n_live < len(active) and n_live <= self.compact_at * len(active):
                keep = live.nonzero().squeeze(-1)
                active, live = active[keep], live[keep]
                kept = slots.keep(keep)
                kv.keep(kept, step, len(keep))
                slot_pos = take(slot_pos, 0, kept, len(keep))
            fed, src, dst = slots.step(tok[active], live, max(logits.shape[1], self.pad_id + 1), self.pad_id)
            if src is not None:  # sequences that parted from their twins: copies of the keys so far
                kv.fork(src, dst, step)
                slot_pos[dst] = slot_pos[src]
            at = slot_pos[: slots.n]
            if whole:
                out = dec.decode_fused(fed, lambda i, qkv: kv.fused(i, qkv, cos_t, sin_t, at, step))
            else:  # the float32 logits take an autocast (policy.precision) result as float32
                out = dec.forward(
                    fed[:, None], cos_t[at][:, None], sin_t[at][:, None], lambda i, q, k, v: kv.attend(i, q, k, v, step)
                )
            logits.index_copy_(0, active, out.float().index_select(0, slots.row))
            slot_pos[: slots.n] += 1
        self.last_rows = (slots.computed, slots.rows)
        return tokens, logps


def prefill(
    dec: Decoder, prompts: list[list[int]], pad_id: int, cos_t: torch.Tensor, sin_t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompt forward of ``prompts`` (u of them, left-padded to width w) on the decoder's device:
    the last position's logits (u, V) float32, the prompt keys/values (layers, 2, u, kv, w, head_dim),
    the attention mask (u, w) and the positions (u, w). ``cos_t``/``sin_t``: :meth:`Decoder.rope_table`
    of at least w columns."""
    device = dec.embed.device
    ids, attn = (x.to(device) for x in left_pad(prompts, pad_id))
    width = ids.shape[1]
    pos = positions_from_mask(attn)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    allowed = causal[None] & attn.bool()[:, None, :]
    # A fully padded query row (left padding) would attend to nothing; let it see itself.
    allowed = (allowed | torch.eye(width, dtype=torch.bool, device=device)[None])[:, None]  # (u, 1, w, w)
    bias = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, float("-inf"))
    # prompt keys/values, one row per distinct prompt: (layers, 2, u, kv, width, head_dim)
    shape = (len(dec.layers), 2, len(prompts), dec.n_kv, width, dec.head_dim)
    prefix = torch.empty(shape, dtype=dec.embed.dtype, device=device)

    def prompt_attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        prefix[i, 0], prefix[i, 1] = k, v
        return dec.prompt_attend(q, k, v, bias)

    return dec.forward(ids, cos_t[pos], sin_t[pos], prompt_attend), prefix, attn, pos
