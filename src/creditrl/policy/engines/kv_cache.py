"""The decode KV caches of :class:`~creditrl.policy.engines.static.StaticEngine`, one per call.

A cache holds ``capacity`` slots, one per distinct sequence being decoded (the rows that are
still identical share one; see :class:`Slots`), of which the first ``n`` are in use:
``n`` is the number of rows of ``q``/``qkv`` at each call. Each slot holds its prompt's
keys/values from the shared-prefix prefill and the response keys/values written at decode step
``step`` (response column ``step``). ``fork(src, dst, step)`` gives slots ``dst`` copies of slots
``src`` (a sequence parting from its twins), ``keep(slots, step, capacity)`` keeps only
``slots``, renumbered from 0, and each cache runs one layer's decode attention:

* :class:`TensorCache`: tensor ops (``policy.kernels=torch``, or a bf16/fp16 policy): prompt
  keys copied into every slot, ``(layers, 2, slots, kv, P, d)``, response keys ``(layers, 2,
  slots, kv, steps, d)``, attention as batched products
  (:meth:`~creditrl.policy.engines.decoder.Decoder.decode_attend`).
* :class:`SharedCache`: the compiled per-(slot, head) kernels: prompt keys once per distinct
  prompt, ``(layers, 2, prompts, kv, P, d)``, response keys per slot as above.
* :class:`RowsCache`: the compiled rows-innermost kernels: one ``(layers, 2, kv, P + steps, d,
  slots)`` cache with each slot's prompt columns copied in, read in one vectorised stream per head.

``attend(i, q, k, v, step)`` serves the tensor-op forward (q, k, v rotated, ``(b, heads|kv, 1,
d)``); ``fused(i, qkv, cos_t, sin_t, pos, step)`` the compiled decode step (rotary, cache write
and attention from the fused projection; not :class:`TensorCache`).
"""

from __future__ import annotations

import torch

from creditrl.policy.engines import kernels as compiled


class Slots:
    """The decode cache's slots: one per distinct sequence among the rows (the ``n`` samples of a
    prompt until they first draw different tokens, and any that keep drawing the same). The
    decode step -- products, attention, norms, MLP -- runs once per slot and its logits are
    copied to every row in it; each row still draws its own token. When the rows of a slot draw
    different tokens, one sequence keeps the slot and each other gets a new slot with a copy of
    the keys so far. Rows that are done keep their slot (their draws are discarded) until the
    cache drops them. With ``share`` off every row is its own slot."""

    def __init__(self, prompt_of: torch.Tensor, share: bool, compiled_step: bool = False) -> None:
        rows = len(prompt_of)
        self.share, self.compiled_step = share, compiled_step
        # each row's slot, and each slot's prompt: one slot per distinct prompt, or per row
        self.row, self.prompt = (
            (prompt_of, torch.arange(int(prompt_of.max()) + 1)) if share else (torch.arange(rows), prompt_of)
        )
        self.n = len(self.prompt)  # slots in use: [0, n)
        self.rows = self.computed = 0  # row-steps decoded, and slot-steps computed

    def step(self, tok: torch.Tensor, live: torch.Tensor, base: int, pad: int):
        """After the rows drew ``tok`` (ids < ``base``; ``live``: rows not done): the token fed to
        each slot, and the slots ``src`` whose keys slots ``dst`` get (None when none parted)."""
        self.rows += len(tok)
        if not self.share:
            self.computed += self.n
            return tok, None, None
        if self.compiled_step:  # the same regrouping in one compiled pass; bookkeeping only, so it
            # serves the tensor-op decode too (the fallback: no numba)
            self.row, fed, src, dst, self.n = compiled.part_slots(self.row, tok, live, self.n, base, pad)
            self.computed += self.n
            return fed, src, dst
        at = live.nonzero().squeeze(-1)
        seqs, of = torch.unique(self.row[at] * base + tok[at], return_inverse=True)  # sorted by slot
        parent = torch.div(seqs, base, rounding_mode="floor")
        heir = torch.ones(len(seqs), dtype=torch.bool)  # the first sequence of each slot keeps it
        heir[1:] = parent[1:] != parent[:-1]
        slot, src, dst = parent.clone(), None, None
        parted = int(len(seqs) - heir.sum())
        if parted:
            src, dst = parent[~heir], torch.arange(self.n, self.n + parted)
            slot[~heir] = dst
            self.n += parted
        self.row = self.row.clone()
        self.row[at] = slot[of]
        fed = torch.full((self.n,), pad, dtype=torch.long)  # slots with no live row: pad
        fed[slot] = seqs - parent * base
        self.computed += self.n
        return fed, src, dst

    def keep(self, keep: torch.Tensor) -> torch.Tensor:
        """Only the rows ``keep`` stay: the slots they use, renumbered from 0 in order."""
        slots, self.row = torch.unique(self.row[keep], return_inverse=True)
        self.n = len(slots)
        return slots


class TensorCache:
    def __init__(
        self, dec, prefix: torch.Tensor, attn: torch.Tensor, slot_prompt: torch.Tensor, steps: int, capacity: int
    ) -> None:
        pbias = torch.zeros(prefix.shape[2], 1, 1, prefix.shape[4]).masked_fill_(
            ~attn.bool()[:, None, None], float("-inf")
        )
        self.dec = dec
        self.prefix, self.pbias = take(prefix, 2, slot_prompt, capacity), take(pbias, 0, slot_prompt, capacity)
        self.resp = _response_cache(dec, capacity, steps, prefix.dtype)

    def keep(self, slots: torch.Tensor, step: int, capacity: int) -> None:
        self.resp, self.prefix = take(self.resp, 2, slots, capacity), take(self.prefix, 2, slots, capacity)
        self.pbias = take(self.pbias, 0, slots, capacity)

    def fork(self, src: torch.Tensor, dst: torch.Tensor, step: int) -> None:
        for x, dim in ((self.resp, 2), (self.prefix, 2), (self.pbias, 0)):
            x.index_copy_(dim, dst, x.index_select(dim, src))

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        n, resp = q.shape[0], self.resp
        resp[i, 0, :n, :, step : step + 1], resp[i, 1, :n, :, step : step + 1] = k, v
        return self.dec.decode_attend(
            q,
            self.prefix[i, 0, :n],
            self.prefix[i, 1, :n],
            resp[i, 0, :n, :, : step + 1],
            resp[i, 1, :n, :, : step + 1],
            self.pbias[:n],
        )


class SharedCache:
    def __init__(
        self, dec, prefix: torch.Tensor, attn: torch.Tensor, slot_prompt: torch.Tensor, steps: int, capacity: int
    ) -> None:
        compiled.match_threads()
        self.dec, self.prefix = dec, prefix
        self.slot_prompt = take(slot_prompt, 0, torch.arange(len(slot_prompt)), capacity)
        self.pstart = (prefix.shape[4] - attn.sum(-1)).to(torch.int64)  # each prompt's first real column
        self.resp = _response_cache(dec, capacity, steps, prefix.dtype)

    def keep(self, slots: torch.Tensor, step: int, capacity: int) -> None:
        self.resp, self.slot_prompt = take(self.resp, 2, slots, capacity), take(self.slot_prompt, 0, slots, capacity)

    def fork(self, src: torch.Tensor, dst: torch.Tensor, step: int) -> None:
        self.resp[:, :, :, :, :step].index_copy_(2, dst, self.resp[:, :, :, :, :step].index_select(2, src))
        self.slot_prompt[dst] = self.slot_prompt[src]

    def _layer(self, i: int) -> tuple[torch.Tensor, ...]:
        """Layer i's prompt keys/values, slot prompts, prompt starts and response keys/values."""
        return self.prefix[i, 0], self.prefix[i, 1], self.slot_prompt, self.pstart, self.resp[i, 0], self.resp[i, 1]

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        n, resp, dec = q.shape[0], self.resp, self.dec
        resp[i, 0, :n, :, step : step + 1], resp[i, 1, :n, :, step : step + 1] = k, v
        # the kernels run over the first q.shape[0] slots
        out = compiled.decode_attention_shared(q, *self._layer(i), step + 1, dec.scale)
        return out.view(n, dec.n_heads, 1, dec.head_dim)

    def fused(self, i, qkv, cos_t, sin_t, pos, step: int) -> torch.Tensor:
        heads, scale = self.dec.n_heads, self.dec.scale
        return compiled.rope_cache_attend_shared(qkv, cos_t, sin_t, pos, heads, *self._layer(i), step + 1, scale)


class RowsCache:
    """Rows innermost: the cache's row axis holds as many slots as are in use, rounded up to
    whole vectors, and grows (doubling, at most ``capacity``) when sequences part: reading a
    slice of a wider row axis reads all of it (the hardware prefetches the neighbouring lines)."""

    def __init__(
        self, dec, prefix: torch.Tensor, attn: torch.Tensor, slot_prompt: torch.Tensor, steps: int, capacity: int
    ) -> None:
        compiled.match_threads()
        layers, _, _, kv, width, d = prefix.shape
        n = len(slot_prompt)
        self.dec, self.width, self.limit = dec, width, _lanes(capacity)
        cap = min(self.limit, _lanes(2 * n))
        self.cache = torch.empty(layers, 2, kv, width + steps, d, cap, dtype=prefix.dtype)
        self.cache[:, :, :, :width, :, :n] = prefix[:, :, slot_prompt].permute(0, 1, 3, 4, 5, 2)
        self.first = torch.zeros(cap, dtype=torch.int64)  # each slot's first real column
        self.first[:n] = (width - attn.sum(-1)).to(torch.int64)[slot_prompt]
        self.forks: tuple[int, torch.Tensor | None, torch.Tensor | None] = (-1, None, None)

    def keep(self, slots: torch.Tensor, step: int, capacity: int) -> None:
        self.limit = _lanes(capacity)
        self._resize(slots, step, min(self.limit, _lanes(2 * len(slots))))

    def _resize(self, slots: torch.Tensor, step: int, cap: int) -> None:
        # columns [0, width + step) are written: the prompt and the tokens fed back so far
        self.cache = compiled.keep_rows(self.cache, slots, self.width + step, cap)
        first = torch.zeros(cap, dtype=torch.int64)
        first[: len(slots)] = self.first[slots]
        self.first = first

    def fork(self, src: torch.Tensor, dst: torch.Tensor, step: int) -> None:
        need, cap = int(dst[-1]) + 1, self.cache.shape[-1]  # dst: the new slots, appended in order
        if need > cap:
            self._resize(torch.arange(int(dst[0])), step, min(self.limit, _lanes(max(need, 2 * cap))))
        # the keys are copied inside each layer's attention kernel at this step, as it streams
        # the cache (cheaper than a separate strided pass)
        self.first[dst] = self.first[src]
        self.forks = (step, src, dst)

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        # q/k-normed models (Qwen3): rotary in tensor ops, the attention compiled
        n, col, cache, dec = q.shape[0], self.width + step, self.cache, self.dec
        cache[i, 0, :, col, :, :n], cache[i, 1, :, col, :, :n] = (
            k[:, :, 0].permute(1, 2, 0),
            v[:, :, 0].permute(1, 2, 0),
        )
        out = compiled.decode_attention(
            q, cache[i, 0], cache[i, 1], self.first[:n], col + 1, dec.scale, *self._forks(step)
        )
        return out.view(n, dec.n_heads, 1, dec.head_dim)

    def fused(self, i, qkv, cos_t, sin_t, pos, step: int) -> torch.Tensor:
        # the kernel runs over whole vectors of slots (a partial one would run scalar); the extra
        # slots are unused ones, with zero queries and keys, and first column 0
        lanes = min(_lanes(qkv.shape[0]), self.cache.shape[-1])
        k, v, first, dec = self.cache[i, 0], self.cache[i, 1], self.first[:lanes], self.dec
        t = self.width + step + 1
        return compiled.rope_cache_attend(
            qkv, cos_t, sin_t, pos, dec.n_heads, k, v, first, t, dec.scale, *self._forks(step), lanes=lanes
        )

    def _forks(self, step: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        at, src, dst = self.forks
        return (src, dst) if at == step else (None, None)


def _lanes(rows: int) -> int:
    """``rows`` rounded up to whole float32 vectors (16 lanes of AVX-512)."""
    return -(-rows // _LANES) * _LANES


_LANES = 16


def take(x: torch.Tensor, dim: int, index: torch.Tensor, capacity: int) -> torch.Tensor:
    """A new tensor with ``capacity`` entries along ``dim``, the first ``len(index)`` of them
    ``x``'s entries ``index`` (the rest unwritten)."""
    shape = list(x.shape)
    shape[dim] = capacity
    out = x.new_empty(shape)
    out.narrow(dim, 0, len(index)).copy_(x.index_select(dim, index))
    return out


def _response_cache(dec, rows: int, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """Response keys/values (layers, 2, rows, kv, steps, head_dim): column j = response token j."""
    return torch.empty(len(dec.layers), 2, rows, dec.n_kv, steps, dec.head_dim, dtype=dtype)
