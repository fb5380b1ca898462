"""Compiled CPU kernels for the decode step of :class:`~creditrl.policy.static_engine.StaticEngine`.

Decoding a ~1M-parameter model at 128 rows, the matrix products are about half of a step; the
rest was many small tensor ops, each paying a fixed cost larger than its arithmetic. Decode
attention was the worst: per layer 512 products of one query (32 values) with a few dozen
keys, at about 0.3 us of ``bmm`` overhead each. These kernels do that work in compiled loops
(numba, float32, on as many threads as torch's intra-op pool):

* :func:`rope_cache_attend`: a layer's attention block from its fused ``q|k|v`` projection:
  rotary embedding of q and k, k and v written into the response cache, then per (row, head)
  the scores over the row's prompt keys and response keys, softmax and the weighted sum of
  values, reading every key and value once. The prompt keys stay one copy per *distinct* prompt
  (``prompt_of`` maps a row to it): the ``n`` samples of a prompt read the same cache lines.
* :func:`decode_attention`: the attention alone (models with per-head q/k norms, Qwen3).
* :func:`rms_norm`: RMSNorm in one pass instead of five ops.
* :func:`sample_tokens`: a decode step's inverse-CDF draw at a temperature (no top-p) and the
  drawn token's raw log-prob in one pass, from uniforms the caller drew from its generator.

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
        from creditrl.policy import _numba_kernels as lib
    except ImportError:  # pragma: no cover - numba is a pinned dependency
        return None
    # numba's first parallel call starts its OpenMP pool, which resets the process's OpenMP
    # thread count (torch's intra-op threads) to the machine's; start it now and restore it
    threads = torch.get_num_threads()
    one = np.ones((1, 1), dtype=np.float32)
    lib._rms(one, one[0], np.float32(1e-6), np.empty_like(one))
    torch.set_num_threads(threads)
    return lib


def available() -> bool:
    """Whether the kernels can run (numba importable)."""
    return _lib() is not None


def _need() -> ModuleType:
    lib = _lib()
    if lib is None:
        raise RuntimeError("creditrl.policy.kernels needs numba (pip install numba)")
    return lib


def match_threads() -> None:
    """Run the kernels on as many threads as torch's intra-op pool (``train.threads``), so two
    jobs with one thread each do not each start a pool the size of the machine."""
    numba = _need().numba
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def decode_attention(
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
    lib = _need()
    b, h, _, d = q.shape
    out = np.empty((b, h * d), dtype=np.float32)
    lib._attend(
        q.reshape(b, h * d).contiguous().numpy(), kp.numpy(), vp.numpy(), prompt_of.numpy(), pstart.numpy(),
        kr.numpy(), vr.numpy(), t, np.float32(scale), out,
    )
    return torch.from_numpy(out)


def rope_cache_attend(
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
    k and v stored in response column ``t - 1``, then :func:`decode_attention`. Returns (b, heads * d)."""
    lib = _need()
    b = qkv.shape[0]
    out = np.empty((b, heads * kr.shape[3]), dtype=np.float32)
    lib._rope_cache_attend(
        qkv.numpy(), cos_t.numpy(), sin_t.numpy(), pos.numpy(), heads, kr.shape[1], kp.numpy(), vp.numpy(),
        prompt_of.numpy(), pstart.numpy(), kr.numpy(), vr.numpy(), t, np.float32(scale), out,
    )
    return torch.from_numpy(out)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row of a contiguous (b, n) float32 tensor."""
    lib = _need()
    out = np.empty(tuple(x.shape), dtype=np.float32)
    lib._rms(x.numpy(), weight.numpy(), np.float32(eps), out)
    return torch.from_numpy(out)


def sample_tokens(
    logits: torch.Tensor, temperature: float, u: torch.Tensor, done: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~creditrl.policy.engine.sample_next` without top-p, and the drawn tokens'
    log-probs under the raw policy, in one pass: (N, V) float32 logits, (N,) float64 uniforms,
    (N,) bool rows already done (they get ``pad_id``). Returns tokens (N,) int64 and log-probs (N,)."""
    lib = _need()
    x = logits.contiguous()
    n = x.shape[0]
    tok, logp = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.float32)
    scratch = np.empty(tuple(x.shape), dtype=np.float32)
    lib._sample(x.numpy(), np.float32(temperature), u.numpy(), done.numpy(), pad_id, scratch, tok, logp)
    return torch.from_numpy(tok), torch.from_numpy(logp)
