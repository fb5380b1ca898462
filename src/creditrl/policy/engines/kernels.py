"""Compiled CPU kernels for the decode step of :class:`~creditrl.policy.engines.static.StaticEngine`.

Decoding a small model, much of a step is small tensor ops whose fixed cost exceeds their
arithmetic, decode attention above all (per layer, one tiny product per row and head). These
kernels do that work in compiled loops (numba, float32, on as many threads as torch's intra-op
pool), one pass each: a layer's attention block from its fused ``q|k|v`` projection
(:func:`rope_cache_attend`; the attention alone, :func:`decode_attention`, for models with
per-head q/k norms), RMSNorm and the gated SiLU (on one thread: a step's rows are less work than
starting a parallel region), the sampling draw with its log-prob, and the cache's bookkeeping.

Two cache layouts: rows innermost, ``(kv, columns, d, rows)`` with each row's own copy of its
prompt's keys, so that every loop runs over contiguous rows and the cache is read front to back
in one stream per head (decode attention is limited by reading the cache;
``benchmarks/attention_in_loop.py``); and per (row, head) with the prompt keys shared per
distinct prompt (``*_shared``), for calls where copying prompts would read far more than sharing
them (long prefixes continued many times).
:meth:`StaticEngine.rows_layout <creditrl.policy.engines.static.StaticEngine.rows_layout>` picks
per call.

Results equal the tensor-op path to float rounding (the sums run in another order); tests in
``tests/policy/test_kernels.py`` check them against slow reference loops, and the engine's
tests run on both paths. numba is imported on first use (:func:`available`); the first call in
a fresh environment compiles for a few seconds and numba caches the machine code on disk.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np
import torch


@functools.cache
def _lib() -> ModuleType | None:
    """The compiled kernels' module, or None where numba cannot be imported."""
    try:
        from creditrl.policy.engines import _numba_kernels as lib
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    # numba's first parallel call starts its OpenMP pool, which resets the process's OpenMP
    # thread count (torch's intra-op threads) to the machine's; start it now and restore it
    threads = torch.get_num_threads()
    lib._start_pool(np.zeros(2, dtype=np.float32))
    torch.set_num_threads(threads)
    return lib


def available() -> bool:
    """Whether the kernels can run (numba importable)."""
    return _lib() is not None


def _need() -> ModuleType:
    lib = _lib()
    if lib is None:
        raise RuntimeError("creditrl.policy.engines.kernels needs numba (pip install numba)")
    return lib


def match_threads() -> None:
    """Run the kernels on as many threads as torch's intra-op pool (``train.threads``), so two
    jobs with one thread each do not each start a pool the size of the machine."""
    numba = _need().numba
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def decode_attention(
    q: torch.Tensor,  # (b, heads, 1, d): rotated queries
    k: torch.Tensor,  # (kv, C, d, b): the layer's keys, rows innermost
    v: torch.Tensor,
    first: torch.Tensor,  # (b,) int64: each row's first real column (left padding before it)
    t: int,
    scale: float,
    src: torch.Tensor | None = None,
    dst: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of one query token per row over its columns [first[i], t) of a
    rows-innermost cache (see :func:`rope_cache_attend`, also for ``src``/``dst``); float32;
    returns (b, heads * d)."""
    b, h, _, d = q.shape
    out = np.empty((b, h * d), dtype=np.float32)
    queries = q.reshape(b, h * d).contiguous()
    _need()._attend(*_np(queries, k, v, first), t, np.float32(scale), *_forks(src, dst), out)
    return torch.from_numpy(out)


_NO_ROWS = np.empty(0, dtype=np.int64)


def _forks(src: torch.Tensor | None, dst: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    return (_NO_ROWS, _NO_ROWS) if src is None else (src.numpy(), dst.numpy())


def _np(*tensors: torch.Tensor) -> list[np.ndarray]:
    """The tensors' numpy views (CPU, no copy) for the kernels."""
    return [t.numpy() for t in tensors]


def rope_cache_attend(
    qkv: torch.Tensor,  # (b, (heads + 2 kv) d): the fused q|k|v projection of one token per row
    cos_t: torch.Tensor,  # (positions, d) rotary tables
    sin_t: torch.Tensor,
    pos: torch.Tensor,  # (b,) int64: each row's position
    heads: int,
    k: torch.Tensor,  # (kv, C, d, b): written at column t - 1
    v: torch.Tensor,
    first: torch.Tensor,
    t: int,
    scale: float,
    src: torch.Tensor | None = None,
    dst: torch.Tensor | None = None,
    lanes: int | None = None,
) -> torch.Tensor:
    """A decode step's attention block in one pass: rotary embedding of q and k at ``pos``,
    k and v stored in column ``t - 1``, then :func:`decode_attention` over columns
    ``[first[i], t)``. The cache holds each row's prompt columns then its response columns, rows
    innermost. Columns before ``first[i]`` (left padding) get weight exactly 0 and must hold finite
    numbers. ``src``/``dst`` (int64, no row in both): rows
    ``dst`` first take rows ``src``'s keys and values of the columns before ``t - 1`` that any
    row reads (from ``first.min()``), copied as the kernel streams the cache, so a fork costs
    almost no extra reading (``dst`` rows need ``first[dst] = first[src]``). The cache may hold
    more rows than ``b``: the first ``b`` are attended. ``lanes`` (>= b, at most the cache's
    rows; ``first`` needs that many entries): run over that many rows, whole vectors, as a
    partial vector of rows runs scalar; rows b.. get zero queries and keys in column ``t - 1``
    and their outputs are dropped. Returns (b, heads * d)."""
    b = qkv.shape[0]
    out = np.empty((lanes or b, heads * k.shape[2]), dtype=np.float32)
    tables, cache = _np(qkv, cos_t, sin_t, pos), _np(k, v, first)
    _need()._rope_cache_attend(*tables, heads, *cache, t, np.float32(scale), *_forks(src, dst), out)
    return torch.from_numpy(out)[:b]


def decode_attention_shared(
    q: torch.Tensor,  # (b, heads, 1, d)
    kp: torch.Tensor,  # (u, kv, P, d): the distinct prompts' keys
    vp: torch.Tensor,
    prompt_of: torch.Tensor,  # (b,) int64: each row's prompt
    pstart: torch.Tensor,  # (u,) int64: each prompt's first real (not left-padding) column
    kr: torch.Tensor,  # (b, kv, T, d): response keys, columns [0, t) valid
    vr: torch.Tensor,
    t: int,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of one query token per row over its prompt's real columns and its
    first ``t`` response columns; float32 tensors; returns (b, heads * d)."""
    b, h, _, d = q.shape
    out = np.empty((b, h * d), dtype=np.float32)
    queries = q.reshape(b, h * d).contiguous()
    _need()._attend_shared(*_np(queries, kp, vp, prompt_of, pstart, kr, vr), t, np.float32(scale), out)
    return torch.from_numpy(out)


def rope_cache_attend_shared(
    qkv: torch.Tensor,  # (b, (heads + 2 kv) d): the fused q|k|v projection of one token per row
    cos_t: torch.Tensor,  # (positions, d) rotary tables
    sin_t: torch.Tensor,
    pos: torch.Tensor,  # (b,) int64: each row's position
    heads: int,
    kp: torch.Tensor,
    vp: torch.Tensor,
    prompt_of: torch.Tensor,
    pstart: torch.Tensor,
    kr: torch.Tensor,  # (b, kv, T, d): written at column t - 1
    vr: torch.Tensor,
    t: int,
    scale: float,
) -> torch.Tensor:
    """A decode step's attention block in one pass: rotary embedding of q and k at ``pos``,
    k and v stored in response column ``t - 1``, then :func:`decode_attention_shared`. Returns (b, heads * d)."""
    out = np.empty((qkv.shape[0], heads * kr.shape[3]), dtype=np.float32)
    tables, cache = _np(qkv, cos_t, sin_t, pos), _np(kp, vp, prompt_of, pstart, kr, vr)
    _need()._rope_cache_attend_shared(*tables, heads, kr.shape[1], *cache, t, np.float32(scale), out)
    return torch.from_numpy(out)


def keep_rows(cache: torch.Tensor, keep: torch.Tensor, used: int, capacity: int | None = None) -> torch.Tensor:
    """A rows-innermost cache (..., columns, d, rows) restricted to the rows ``keep`` (int64),
    columns [0, used) copied into rows [0, len(keep)) of a new cache of ``capacity`` rows
    (default len(keep)); the rest of the new cache is left unwritten."""
    lib = _need()
    *lead, cols, d, b = cache.shape
    cap = len(keep) if capacity is None else capacity
    out = torch.empty(*lead, cols, d, cap, dtype=cache.dtype)
    lib._keep_rows(cache.reshape(-1, cols, d, b).numpy(), keep.numpy(), used, out.view(-1, cols, d, cap).numpy())
    return out


def part_slots(
    row: torch.Tensor, tok: torch.Tensor, live: torch.Tensor, n: int, base: int, pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
    """:meth:`creditrl.policy.engines.kv_cache.Slots.step`'s regrouping in one compiled pass: rows'
    slots ``row`` (int64) after the live rows drew ``tok`` (ids < ``base``). Returns each row's
    new slot, the token fed to each slot (``pad`` for slots with no live row), the slots
    ``src`` copied to the new slots ``dst`` (None when none), and the new slot count."""
    new_row = row.numpy().copy()
    m = int(live.sum())
    fed = np.empty(n + m, dtype=np.int64)
    src, dst = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    new_n, copies = _need()._part_slots(new_row, tok.numpy(), live.numpy(), n, base, pad, fed, src, dst)
    forks = (torch.from_numpy(src[:copies]), torch.from_numpy(dst[:copies])) if copies else (None, None)
    return torch.from_numpy(new_row), torch.from_numpy(fed[:new_n]), *forks, int(new_n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of a contiguous (b, n) float32 tensor."""
    lib = _need()
    out = np.empty(tuple(x.shape), dtype=np.float32)
    lib._rms(x.numpy(), weight.numpy(), np.float32(eps), out)
    return torch.from_numpy(out)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a contiguous (b, 2 * inter) float32 ``[gate | up]`` projection: (b, inter)."""
    lib = _need()
    out = np.empty((gu.shape[0], gu.shape[1] // 2), dtype=np.float32)
    lib._silu_mul(gu.numpy(), out)
    return torch.from_numpy(out)


def sample_tokens(
    logits: torch.Tensor, temperature: float, u: torch.Tensor, done: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~creditrl.policy.engines.base.sample_next` without top-p, and the drawn tokens'
    log-probs under the raw policy, in one pass: (N, V) float32 logits, (N,) float64 uniforms,
    (N,) bool rows already done (they get ``pad_id``). Returns tokens (N,) int64 and log-probs (N,)."""
    lib = _need()
    x = logits.contiguous()
    n = x.shape[0]
    tok, logp = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.float32)
    scratch = np.empty(tuple(x.shape), dtype=np.float32)
    lib._sample(x.numpy(), np.float32(temperature), u.numpy(), done.numpy(), pad_id, scratch, tok, logp)
    return torch.from_numpy(tok), torch.from_numpy(logp)
