"""The numba-compiled loops behind :mod:`creditrl.policy.kernels` (imported on first use:
importing numba costs about 0.35 s). See that module for what each computes."""

import math

import numba
import numpy as np


@numba.njit(fastmath={"reassoc", "contract"}, cache=True, inline="always")
def _attend_head(qbuf, i, kp, vp, u, s0, kr, vr, g, t, scale, scores, acc, out, obase):
    """Head of row i (query qbuf[i]) against prompt u's keys from column s0 and the row's
    first t response keys; writes out[i, obase : obase + d]. Whole arrays and indices only:
    a view per row or key costs an atomic reference count that the threads contend for."""
    d = qbuf.shape[1]
    width = kp.shape[2]
    m = np.float32(-np.inf)
    for j in range(s0, width):
        a = np.float32(0.0)
        for c in range(d):
            a += qbuf[i, c] * kp[u, g, j, c]
        a *= scale
        scores[i, j] = a
        m = max(m, a)
    for j in range(t):
        a = np.float32(0.0)
        for c in range(d):
            a += qbuf[i, c] * kr[i, g, j, c]
        a *= scale
        scores[i, width + j] = a
        m = max(m, a)
    total = np.float32(0.0)
    for j in range(s0, width + t):
        e = np.float32(math.exp(scores[i, j] - m))
        scores[i, j] = e
        total += e
    for c in range(d):
        acc[i, c] = 0.0
    for j in range(s0, width):
        w = scores[i, j]
        for c in range(d):
            acc[i, c] += w * vp[u, g, j, c]
    for j in range(t):
        w = scores[i, width + j]
        for c in range(d):
            acc[i, c] += w * vr[i, g, j, c]
    inv = np.float32(1.0) / total
    for c in range(d):
        out[i, obase + c] = acc[i, c] * inv


@numba.njit(cache=True, inline="always")
def _scratch(b, width, d):
    """Per-row scratch of the attention kernels: scores (b, width), value sums and the query (b, d)."""
    return (np.empty((b, width), dtype=np.float32), np.empty((b, d), dtype=np.float32),
            np.empty((b, d), dtype=np.float32))


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def _attend(q, kp, vp, prompt_of, pstart, kr, vr, t, scale, out):
    # q (b, h * d) = (b, h, d) flattened; kp/vp (u, kv, P, d) one row per distinct prompt,
    # real columns from pstart[u]; kr/vr (b, kv, T, d), response columns [0, t); out (b, h * d).
    b = q.shape[0]
    kv, d = kp.shape[1], kp.shape[3]
    h = q.shape[1] // d
    group = h // kv
    scores, acc, qbuf = _scratch(b, kp.shape[2] + t, d)
    for i in numba.prange(b):
        u = prompt_of[i]
        for head in range(h):
            for c in range(d):
                qbuf[i, c] = q[i, head * d + c]
            _attend_head(qbuf, i, kp, vp, u, pstart[u], kr, vr, head // group, t, scale, scores, acc, out, head * d)


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def _rope_cache_attend(qkv, cos_t, sin_t, pos, h, kv, kp, vp, prompt_of, pstart, kr, vr, t, scale, out):
    # qkv (b, (h + 2 kv) d) fresh from the fused projection; rotates q and k at each row's
    # position (HF's x * cos + rotate_half(x) * sin), writes k and v into response column
    # t - 1 of kr/vr, then attends.
    b = qkv.shape[0]
    d = kr.shape[3]
    half = d // 2
    group = h // kv
    scores, acc, qbuf = _scratch(b, kp.shape[2] + t, d)
    for i in numba.prange(b):
        p = pos[i]
        for g in range(kv):
            kb, vb = (h + g) * d, (h + kv + g) * d
            for c in range(half):
                kr[i, g, t - 1, c] = qkv[i, kb + c] * cos_t[p, c] + (-qkv[i, kb + c + half]) * sin_t[p, c]
            for c in range(half, d):
                kr[i, g, t - 1, c] = qkv[i, kb + c] * cos_t[p, c] + qkv[i, kb + c - half] * sin_t[p, c]
            for c in range(d):
                vr[i, g, t - 1, c] = qkv[i, vb + c]
        u = prompt_of[i]
        for head in range(h):
            qb = head * d
            for c in range(half):
                qbuf[i, c] = qkv[i, qb + c] * cos_t[p, c] + (-qkv[i, qb + c + half]) * sin_t[p, c]
            for c in range(half, d):
                qbuf[i, c] = qkv[i, qb + c] * cos_t[p, c] + qkv[i, qb + c - half] * sin_t[p, c]
            _attend_head(qbuf, i, kp, vp, u, pstart[u], kr, vr, head // group, t, scale, scores, acc, out, qb)


@numba.njit(parallel=True, cache=True)
def _rms(x, w, eps, out):
    """out = w * (x * rsqrt(mean(x^2) + eps)) per row (the HF LlamaRMSNorm op order)."""
    n = x.shape[1]
    for i in numba.prange(x.shape[0]):
        ss = np.float32(0.0)
        for c in range(n):
            ss += x[i, c] * x[i, c]
        r = np.float32(1.0) / np.sqrt(ss / np.float32(n) + eps)
        for c in range(n):
            out[i, c] = w[c] * (x[i, c] * r)


@numba.njit(parallel=True, cache=True)
def _sample(logits, temperature, u, done, pad, scratch, tok, logp):
    """Per row: inverse-CDF draw from softmax(logits / temperature) (float32 probabilities, a
    float64 running sum, the first token whose cumulative mass exceeds u * total, never a token
    of mass 0), pad for rows already done; logp = the drawn token's log-softmax at temperature 1."""
    n, vocab = logits.shape
    for i in numba.prange(n):
        m = np.float32(-np.inf)
        for j in range(vocab):
            m = max(m, logits[i, j] / temperature)
        s = np.float32(0.0)
        for j in range(vocab):
            e = np.float32(math.exp(logits[i, j] / temperature - m))
            scratch[i, j] = e
            s += e
        total = 0.0
        for j in range(vocab):
            scratch[i, j] = scratch[i, j] / s
            total += np.float64(scratch[i, j])
        target = u[i] * total
        k = -1
        run = 0.0
        for j in range(vocab):
            run += np.float64(scratch[i, j])
            if run > target:
                k = j
                break
        if k < 0:  # u * total rounded up to total: the last token with mass
            for j in range(vocab - 1, -1, -1):
                if scratch[i, j] > 0:
                    k = j
                    break
        if done[i]:
            k = pad
        tok[i] = k
        m1 = logits[i, 0]
        for j in range(vocab):
            m1 = max(m1, logits[i, j])
        s1 = np.float32(0.0)
        for j in range(vocab):
            s1 += np.float32(math.exp(logits[i, j] - m1))
        logp[i] = (logits[i, k] - m1) - np.float32(math.log(s1))
