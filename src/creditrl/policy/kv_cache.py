"""The decode KV caches of :class:`~creditrl.policy.static_engine.StaticEngine`, one per call.

Each holds the prompt keys/values from the shared-prefix prefill and the response keys/values
written at decode step ``step`` (response column ``step``), drops finished rows (``keep``) and
runs one layer's decode attention:

* :class:`TensorCache`: tensor ops (``policy.kernels=torch``, or a bf16/fp16 policy): prompt
  keys copied into every row, ``(layers, 2, rows, kv, P, d)``, response keys ``(layers, 2, rows,
  kv, steps, d)``, attention as batched products (:meth:`_Decoder.decode_attend`).
* :class:`SharedCache`: the compiled per-(row, head) kernels: prompt keys once per distinct
  prompt, ``(layers, 2, prompts, kv, P, d)``, response keys per row as above.
* :class:`RowsCache`: the compiled rows-innermost kernels: one ``(layers, 2, kv, P + steps, d,
  rows)`` cache with each row's prompt columns copied in, read in one vectorised stream per head.

``attend(i, q, k, v, step)`` serves the tensor-op forward (q, k, v rotated, ``(b, heads|kv, 1,
d)``); ``fused(i, qkv, cos_t, sin_t, pos, step)`` the compiled decode step (rotary, cache write
and attention from the fused projection; not :class:`TensorCache`).
"""

from __future__ import annotations

import torch

from creditrl.policy import kernels as compiled


class TensorCache:
    def __init__(self, dec, prefix: torch.Tensor, attn: torch.Tensor, prompt_of: torch.Tensor, steps: int) -> None:
        pbias = torch.zeros(prefix.shape[2], 1, 1, prefix.shape[4]).masked_fill_(~attn.bool()[:, None, None], float("-inf"))
        self.dec = dec
        self.prefix, self.pbias = prefix[:, :, prompt_of], pbias[prompt_of]  # one row per request
        self.resp = _response_cache(dec, len(prompt_of), steps, prefix.dtype)

    def keep(self, keep: torch.Tensor, step: int) -> None:
        self.resp, self.prefix, self.pbias = self.resp[:, :, keep], self.prefix[:, :, keep], self.pbias[keep]

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        resp = self.resp
        resp[i, 0, :, :, step : step + 1], resp[i, 1, :, :, step : step + 1] = k, v
        return self.dec.decode_attend(
            q, self.prefix[i, 0], self.prefix[i, 1], resp[i, 0, :, :, : step + 1], resp[i, 1, :, :, : step + 1],
            self.pbias,
        )


class SharedCache:
    def __init__(self, dec, prefix: torch.Tensor, attn: torch.Tensor, prompt_of: torch.Tensor, steps: int) -> None:
        compiled.match_threads()
        self.dec, self.prefix, self.row_prompt = dec, prefix, prompt_of
        self.pstart = (prefix.shape[4] - attn.sum(-1)).to(torch.int64)  # each prompt's first real column
        self.resp = _response_cache(dec, len(prompt_of), steps, prefix.dtype)

    def keep(self, keep: torch.Tensor, step: int) -> None:
        self.resp, self.row_prompt = self.resp[:, :, keep], self.row_prompt[keep]

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        resp, dec = self.resp, self.dec
        resp[i, 0, :, :, step : step + 1], resp[i, 1, :, :, step : step + 1] = k, v
        out = compiled.decode_attention_shared(
            q, self.prefix[i, 0], self.prefix[i, 1], self.row_prompt, self.pstart, resp[i, 0], resp[i, 1], step + 1,
            dec.scale,
        )
        return out.view(q.shape[0], dec.n_heads, 1, dec.head_dim)

    def fused(self, i, qkv, cos_t, sin_t, pos, step: int) -> torch.Tensor:
        return compiled.rope_cache_attend_shared(
            qkv, cos_t, sin_t, pos, self.dec.n_heads, self.prefix[i, 0], self.prefix[i, 1], self.row_prompt,
            self.pstart, self.resp[i, 0], self.resp[i, 1], step + 1, self.dec.scale,
        )


class RowsCache:
    def __init__(self, dec, prefix: torch.Tensor, attn: torch.Tensor, prompt_of: torch.Tensor, steps: int) -> None:
        compiled.match_threads()
        layers, _, _, kv, width, d = prefix.shape
        self.dec, self.width = dec, width
        self.cache = torch.empty(layers, 2, kv, width + steps, d, len(prompt_of), dtype=prefix.dtype)
        self.cache[:, :, :, :width] = prefix[:, :, prompt_of].permute(0, 1, 3, 4, 5, 2)
        self.first = (width - attn.sum(-1)).to(torch.int64)[prompt_of]  # each row's first real column

    def keep(self, keep: torch.Tensor, step: int) -> None:
        # columns [0, width + step) are written: the prompt and the tokens fed back so far
        self.cache, self.first = compiled.keep_rows(self.cache, keep, self.width + step), self.first[keep]

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        # q/k-normed models (Qwen3): rotary in tensor ops, the attention compiled
        col, cache, dec = self.width + step, self.cache, self.dec
        cache[i, 0, :, col], cache[i, 1, :, col] = k[:, :, 0].permute(1, 2, 0), v[:, :, 0].permute(1, 2, 0)
        out = compiled.decode_attention(q, cache[i, 0], cache[i, 1], self.first, col + 1, dec.scale)
        return out.view(q.shape[0], dec.n_heads, 1, dec.head_dim)

    def fused(self, i, qkv, cos_t, sin_t, pos, step: int) -> torch.Tensor:
        return compiled.rope_cache_attend(
            qkv, cos_t, sin_t, pos, self.dec.n_heads, self.cache[i, 0], self.cache[i, 1], self.first,
            self.width + step + 1, self.dec.scale,
        )


def _response_cache(dec, rows: int, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """Response keys/values (layers, 2, rows, kv, steps, head_dim): column j = response token j."""
    return torch.empty(len(dec.layers), 2, rows, dec.n_kv, steps, dec.head_dim, dtype=dtype)
