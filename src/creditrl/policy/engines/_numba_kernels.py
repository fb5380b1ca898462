"""The numba-compiled loops behind :mod:`creditrl.policy.engines.kernels` (imported on first use,
as importing numba is slow). See that module for what each computes."""

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

FAST = {"reassoc", "contract"}  # no nnan/ninf: masked scores are -inf


@intrinsic
def _bits_as_f32(typingctx, x):
    """The float32 whose bits are the int32 ``x`` (an LLVM bitcast; vectorises)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


def _exp_coefficients() -> tuple:
    """Degree-6 polynomial for exp on [-ln2/2, ln2/2]: a least-squares fit at 64 Chebyshev nodes
    in float64 (relative error about 1e-9 there, so float32 rounding dominates)."""
    x = np.cos(np.pi * (np.arange(64) + 0.5) / 64) * (math.log(2) / 2)
    return tuple(np.float32(c) for c in np.polynomial.polynomial.polyfit(x, np.exp(x), 6))


_C0, _C1, _C2, _C3, _C4, _C5, _C6 = _exp_coefficients()
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # ln 2 split in two (Cody-Waite): k * _LN2_HI is exact
_LN2_LO = np.float32(-2.1219444005469057e-4)


@numba.njit(fastmath={"contract"}, cache=True, inline="always")
def _exp_neg(x):
    """exp(x) for float32 x <= 0 in arithmetic only, so loops over it vectorise (libm's expf is a
    call per element): x = k ln2 + r, |r| <= ln2 / 2, exp(r) by polynomial, 2^k by building the
    float's exponent bits. Relative error under 2e-7 down to x = -87 (tested; below: exp(-87))."""
    x = max(x, np.float32(-87.0))
    k = np.floor(x * _LOG2E + np.float32(0.5))
    r = (x - k * _LN2_HI) - k * _LN2_LO
    p = _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + _C2
    p = p * r + _C1
    p = p * r + _C0
    return p * _bits_as_f32((np.int32(k) + np.int32(127)) << np.int32(23))


@numba.njit(cache=True, inline="always")
def _fork_column(x, g, j, src, dst, t):
    """x[g, j, :, dst[n]] = x[g, j, :, src[n]] for a column j before t - 1 (the new one)."""
    if j < t - 1:
        for c in range(x.shape[2]):
            for n in range(src.shape[0]):
                x[g, j, c, dst[n]] = x[g, j, c, src[n]]


@numba.njit(fastmath=FAST, error_model="numpy", cache=True)
def _head(q, k, v, g, first, j0, t, s, m, total, acc, out, head, src, dst, fork):
    """Head ``head`` of every row against kv head ``g``'s columns [j0, t) (row i's from first[i]):
    q (heads, d, b) scaled queries; k, v (kv, C, d, b); writes out[:, head * d : (head + 1) * d].
    Rows are the innermost axis of every array, so each loop below runs over contiguous rows
    and vectorises; the cache is read column after column, front to back. With ``fork``, rows
    dst[n] first get row src[n]'s keys and values of columns [j0, t - 1) as they stream past
    (a sequence parting from its twins; columns before j0 are never read)."""
    d, b = q.shape[1], q.shape[2]
    for i in range(b):
        m[head, i] = -np.inf
        total[head, i] = 0.0
    if fork:  # one column ahead of the reads: a vector load right after a store into it stalls
        _fork_column(k, g, j0, src, dst, t)
    for j in range(j0, t):
        if fork:
            _fork_column(k, g, j + 1, src, dst, t)
        for i in range(b):
            s[head, j, i] = 0.0
        for c in range(d):
            for i in range(b):
                s[head, j, i] += q[head, c, i] * k[g, j, c, i]
        for i in range(b):
            x = s[head, j, i] if j >= first[i] else np.float32(-np.inf)
            s[head, j, i] = x
            m[head, i] = max(m[head, i], x)
    for j in range(j0, t):
        for i in range(b):
            e = _exp_neg(s[head, j, i] - m[head, i]) if j >= first[i] else np.float32(0.0)
            s[head, j, i] = e
            total[head, i] += e
    for c in range(d):
        for i in range(b):
            acc[head, c, i] = 0.0
    if fork:
        _fork_column(v, g, j0, src, dst, t)
    for j in range(j0, t):
        if fork:
            _fork_column(v, g, j + 1, src, dst, t)
        for c in range(d):
            for i in range(b):
                acc[head, c, i] += s[head, j, i] * v[g, j, c, i]
    for i in range(b):
        inv = np.float32(1.0) / total[head, i]
        for c in range(d):
            out[i, head * d + c] = acc[head, c, i] * inv


@numba.njit(cache=True, inline="always")
def _scratch(h, d, b, t):
    """The attention's scratch: scores (h, t, b), queries and value sums (h, d, b), max and sum (h, b)."""
    return (
        np.empty((h, t, b), dtype=np.float32),
        np.empty((h, d, b), dtype=np.float32),
        np.empty((h, d, b), dtype=np.float32),
        np.empty((h, b), dtype=np.float32),
        np.empty((h, b), dtype=np.float32),
    )


@numba.njit(fastmath=FAST, error_model="numpy", cache=True)
def _rope_rows(x, base, cos_t, sin_t, pos, scale, dst, a, col):
    """dst[a, col, c, i] = (rotary embedding of x[i, base : base + d] at pos[i])[c] * scale:
    HF's x * cos + rotate_half(x) * sin, written rows-innermost."""
    d = dst.shape[2]
    half = d // 2
    for c in range(half):
        for i in range(x.shape[0]):
            p = pos[i]
            dst[a, col, c, i] = (x[i, base + c] * cos_t[p, c] - x[i, base + c + half] * sin_t[p, c]) * scale
    for c in range(half, d):
        for i in range(x.shape[0]):
            p = pos[i]
            dst[a, col, c, i] = (x[i, base + c] * cos_t[p, c] + x[i, base + c - half] * sin_t[p, c]) * scale


@numba.njit(parallel=True, fastmath=FAST, error_model="numpy", cache=True)
def _attend(q, k, v, first, t, scale, src, dst, out):
    # q (b, h * d) rotated queries; k/v (kv, C, d, b) with columns [0, t) valid; out (b, h * d)
    b = q.shape[0]
    kv, d = k.shape[0], k.shape[2]
    h = q.shape[1] // d
    s, qt, acc, m, total = _scratch(h, d, b, t)
    j0 = first.min()
    group = h // kv
    for g in numba.prange(kv):  # a kv head per thread: its first query head copies forked rows
        for head in range(g * group, (g + 1) * group):
            for c in range(d):
                for i in range(b):
                    qt[head, c, i] = q[i, head * d + c] * scale
            _head(qt, k, v, g, first, j0, t, s, m, total, acc, out, head, src, dst, head == g * group)


@numba.njit(parallel=True, fastmath=FAST, error_model="numpy", cache=True)
def _rope_cache_attend(qkv, cos_t, sin_t, pos, h, k, v, first, t, scale, src, dst, out):
    # qkv (b, (h + 2 kv) d) fresh from the fused projection; rotates k at each row's position
    # and writes k and v into column t - 1 of k/v (kv, C, d, rows), rotates q, then attends.
    # It runs over lanes = out.shape[0] >= b rows (whole vectors): rows b.. get zero queries
    # and keys, and their outputs are discarded
    b, lanes = qkv.shape[0], out.shape[0]
    kv, d = k.shape[0], k.shape[2]
    group = h // kv
    s, qt, acc, m, total = _scratch(h, d, lanes, t)
    q4 = qt.reshape((h, 1, d, lanes))
    j0 = first.min()
    for g in numba.prange(kv):  # one parallel region: a kv head's column, then the heads reading it
        _rope_rows(qkv, (h + g) * d, cos_t, sin_t, pos, np.float32(1.0), k, g, t - 1)
        for c in range(d):
            for i in range(b):
                v[g, t - 1, c, i] = qkv[i, (h + kv + g) * d + c]
            for i in range(b, lanes):
                k[g, t - 1, c, i] = 0.0
                v[g, t - 1, c, i] = 0.0
        for head in range(g * group, (g + 1) * group):
            _rope_rows(qkv, head * d, cos_t, sin_t, pos, scale, q4, head, 0)
            for c in range(d):
                for i in range(b, lanes):
                    qt[head, c, i] = 0.0
            _head(qt, k, v, g, first, j0, t, s, m, total, acc, out, head, src, dst, head == g * group)


# The shared-prompt layout: per (row, head), the prompt keys kept once per distinct prompt,
# (u, kv, P, d), and the response keys per row, (b, kv, T, d).


@numba.njit(fastmath={"reassoc", "contract"}, cache=True, inline="always")
def _attend_head_shared(qbuf, i, kp, vp, u, s0, kr, vr, g, t, scale, scores, acc, out, obase):
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
def _scratch_shared(b, width, d):
    """Per-row scratch of the attention kernels: scores (b, width), value sums and the query (b, d)."""
    return (
        np.empty((b, width), dtype=np.float32),
        np.empty((b, d), dtype=np.float32),
        np.empty((b, d), dtype=np.float32),
    )


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def _attend_shared(q, kp, vp, prompt_of, pstart, kr, vr, t, scale, out):
    # q (b, h * d) = (b, h, d) flattened; kp/vp (u, kv, P, d) one row per distinct prompt,
    # real columns from pstart[u]; kr/vr (b, kv, T, d), response columns [0, t); out (b, h * d).
    b = q.shape[0]
    kv, d = kp.shape[1], kp.shape[3]
    h = q.shape[1] // d
    group = h // kv
    scores, acc, qbuf = _scratch_shared(b, kp.shape[2] + t, d)
    for i in numba.prange(b):
        u = prompt_of[i]
        for head in range(h):
            for c in range(d):
                qbuf[i, c] = q[i, head * d + c]
            _attend_head_shared(
                qbuf, i, kp, vp, u, pstart[u], kr, vr, head // group, t, scale, scores, acc, out, head * d
            )


@numba.njit(parallel=True, fastmath={"reassoc", "contract"}, cache=True)
def _rope_cache_attend_shared(qkv, cos_t, sin_t, pos, h, kv, kp, vp, prompt_of, pstart, kr, vr, t, scale, out):
    # qkv (b, (h + 2 kv) d) fresh from the fused projection; rotates q and k at each row's
    # position (HF's x * cos + rotate_half(x) * sin), writes k and v into response column
    # t - 1 of kr/vr, then attends.
    b = qkv.shape[0]
    d = kr.shape[3]
    half = d // 2
    group = h // kv
    scores, acc, qbuf = _scratch_shared(b, kp.shape[2] + t, d)
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
            _attend_head_shared(qbuf, i, kp, vp, u, pstart[u], kr, vr, head // group, t, scale, scores, acc, out, qb)


@numba.njit(parallel=True, cache=True)
def _keep_rows(src, keep, used, dst):
    """dst[a, j, c, r] = src[a, j, c, keep[r]] for columns j < used: the rows-innermost cache
    without its finished rows (columns from ``used`` on are not yet written and not copied)."""
    for a in numba.prange(src.shape[0]):
        for j in range(used):
            for c in range(src.shape[2]):
                for r in range(keep.shape[0]):
                    dst[a, j, c, r] = src[a, j, c, keep[r]]


@numba.njit(cache=True)
def _part_slots(row, tok, live, n, base, pad, fed, src, dst):
    """Slots after a decode step's draws (kv_cache.Slots.step): live rows grouped by (slot,
    token) in sorted order; a slot's first group keeps it, each other takes slot n, n + 1, ...
    (src/dst record the copies). Rewrites row for live rows and fed[: new n]; returns (new n,
    copies)."""
    idx = np.empty(row.shape[0], dtype=np.int64)
    m = 0
    for i in range(row.shape[0]):
        if live[i]:
            idx[m] = i
            m += 1
    keys = np.empty(m, dtype=np.int64)
    for a in range(m):
        keys[a] = row[idx[a]] * base + tok[idx[a]]
    order = np.argsort(keys, kind="mergesort")
    for s in range(n):
        fed[s] = pad  # a slot whose rows are all done
    new_n, copies = n, 0
    prev_key, prev_parent, slot = -1, -1, -1
    for a in range(m):
        key = keys[order[a]]
        if key != prev_key:
            parent = key // base
            if parent == prev_parent:
                slot = new_n
                src[copies], dst[copies] = parent, new_n
                copies += 1
                new_n += 1
            else:
                slot = parent
            fed[slot] = key - parent * base
            prev_key, prev_parent = key, parent
        row[idx[order[a]]] = slot
    return new_n, copies


@numba.njit(parallel=True, cache=True)
def _start_pool(x):
    """A parallel loop that does nothing useful: its first call starts numba's thread pool."""
    for i in numba.prange(x.shape[0]):
        x[i] += 1.0


@numba.njit(fastmath=FAST, error_model="numpy", cache=True)
def _rms(x, w, eps, out):
    """out = w * (x * rsqrt(mean(x^2) + eps)) per row (the HF LlamaRMSNorm op order). One
    thread: a decode step's (rows, hidden) is a few microseconds of work, less than waking a
    second thread costs."""
    n = x.shape[1]
    for i in range(x.shape[0]):
        ss = np.float32(0.0)
        for c in range(n):
            ss += x[i, c] * x[i, c]
        r = np.float32(1.0) / np.sqrt(ss / np.float32(n) + eps)
        for c in range(n):
            out[i, c] = w[c] * (x[i, c] * r)


@numba.njit(fastmath=FAST, error_model="numpy", cache=True)
def _silu_mul(gu, out):
    """out = silu(gate) * up for gu = [gate | up] per row (one thread, as :func:`_rms`);
    silu(x) = x * sigmoid(x), the sigmoid from exp(-|x|) so the loop vectorises."""
    inter = out.shape[1]
    for i in range(gu.shape[0]):
        for c in range(inter):
            x = gu[i, c]
            e = _exp_neg(min(x, -x))
            r = np.float32(1.0) / (np.float32(1.0) + e)
            out[i, c] = x * (r if x >= 0 else e * r) * gu[i, inter + c]


@numba.njit(parallel=True, fastmath=FAST, error_model="numpy", cache=True)
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
            x = logits[i, j] / temperature - m
            e = _exp_neg(x) if x > -np.inf else np.float32(0.0)  # a -inf logit has mass exactly 0
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
            x = logits[i, j] - m1
            s1 += _exp_neg(x) if x > -np.inf else np.float32(0.0)
        logp[i] = (logits[i, k] - m1) - np.float32(math.log(s1))
