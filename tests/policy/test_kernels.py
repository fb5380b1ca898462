"""The compiled decode kernels (creditrl.policy.engines.kernels) against slow reference loops written
with plain tensor ops, on random inputs: grouped-query heads, left-padded prompts of different
lengths shared by several rows, response columns beyond ``t`` filled with garbage that must not
be read."""

import math

import pytest
import torch

from creditrl.policy.engines import SamplingParams, StaticEngine, kernels
from creditrl.policy.engines import static as se
from creditrl.policy.engines.static import SHARED_LAYOUT_BELOW
from creditrl.policy.model import build_tiny


def reference_attention(q, kp, vp, prompt_of, pstart, kr, vr, t, scale):
    """One (row, head) at a time: softmax over the prompt's real columns, then the response's."""
    b, h, _, d = q.shape
    group = h // kp.shape[1]
    out = torch.zeros(b, h * d, dtype=torch.float64)
    for i in range(b):
        u = int(prompt_of[i])
        for head in range(h):
            g = head // group
            keys = torch.cat([kp[u, g, int(pstart[u]) :], kr[i, g, :t]]).double()
            vals = torch.cat([vp[u, g, int(pstart[u]) :], vr[i, g, :t]]).double()
            w = torch.softmax(keys @ q[i, head, 0].double() * scale, dim=0)
            out[i, head * d : (head + 1) * d] = w @ vals
    return out


def rope_reference(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def rows_last(kp, kr, prompt_of):
    """The kernels' cache of one layer, (kv, P + steps, d, b): each row's prompt columns, then its
    response columns, rows innermost."""
    return torch.cat([kp[prompt_of], kr], dim=2).permute(1, 2, 3, 0).contiguous()


def random_case(seed, b=7, u=3, heads=4, kv=2, d=8, width=5, steps=6):
    g = torch.Generator().manual_seed(seed)
    kp, vp = torch.randn(u, kv, width, d, generator=g), torch.randn(u, kv, width, d, generator=g)
    pstart = torch.tensor([0, 2, width - 1])[:u]  # prompts of length 5, 3 and 1
    prompt_of = torch.randint(0, u, (b,), generator=g)
    kr, vr = torch.randn(b, kv, steps, d, generator=g), torch.randn(b, kv, steps, d, generator=g)
    return g, kp, vp, pstart, prompt_of, kr, vr


def attention(layout, q, kp, vp, prompt_of, pstart, kr, vr, t, scale):
    """Decode attention over response columns [0, t) through either cache layout's kernel."""
    if layout == "shared":
        return kernels.decode_attention_shared(q, kp, vp, prompt_of, pstart, kr, vr, t, scale)
    k, v = rows_last(kp, kr, prompt_of), rows_last(vp, vr, prompt_of)
    return kernels.decode_attention(q, k, v, pstart[prompt_of], kp.shape[2] + t, scale)


@pytest.mark.parametrize("layout", ["rows", "shared"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kv", [1, 2, 4])
def test_decode_attention_matches_reference(layout, seed, kv):
    g, kp, vp, pstart, prompt_of, kr, vr = random_case(seed, kv=kv)
    q = torch.randn(7, 4, 1, 8, generator=g)
    for t in (1, 3, 6):
        got = attention(layout, q, kp, vp, prompt_of, pstart, kr, vr, t, 8**-0.5)
        want = reference_attention(q, kp, vp, prompt_of, pstart, kr, vr, t, 8**-0.5)
        assert got.shape == (7, 32)
        assert float((got.double() - want).abs().max()) < 1e-5


@pytest.mark.parametrize("layout", ["rows", "shared"])
def test_decode_attention_ignores_padding_and_later_columns(layout):
    g, kp, vp, pstart, prompt_of, kr, vr = random_case(0)
    q = torch.randn(7, 4, 1, 8, generator=g)
    base = attention(layout, q, kp, vp, prompt_of, pstart, kr, vr, 3, 0.3)
    kp2, vp2, kr2, vr2 = kp.clone(), vp.clone(), kr.clone(), vr.clone()
    kp2[1, :, :2] = 1e6  # prompt 1's left padding
    vp2[2, :, : kp.shape[2] - 1] = 3e4  # prompt 2's left padding (finite, as the prefill leaves it)
    kr2[:, :, 3:], vr2[:, :, 3:] = float("nan"), float("nan")  # response columns not yet written
    assert torch.equal(attention(layout, q, kp2, vp2, prompt_of, pstart, kr2, vr2, 3, 0.3), base)


@pytest.mark.parametrize("layout", ["rows", "shared"])
@pytest.mark.parametrize("seed", range(3))
def test_rope_cache_attend_matches_reference_and_writes_the_cache(layout, seed):
    g, kp, vp, pstart, prompt_of, kr, vr = random_case(seed)
    b, heads, kv, d, t = 7, 4, 2, 8, 4
    qkv = torch.randn(b, (heads + 2 * kv) * d, generator=g)
    cos_t, sin_t = torch.randn(20, d, generator=g), torch.randn(20, d, generator=g)
    pos = torch.randint(0, 20, (b,), generator=g)
    q = qkv[:, : heads * d].view(b, heads, d)
    kn = qkv[:, heads * d : (heads + kv) * d].view(b, kv, d)
    vn = qkv[:, (heads + kv) * d :].view(b, kv, d)
    cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]
    kr_ref, vr_ref = kr.clone(), vr.clone()
    kr_ref[:, :, t - 1], vr_ref[:, :, t - 1] = rope_reference(kn, cos, sin), vn
    if layout == "rows":  # (kv, P + steps, d, rows): the new token in column P + t - 1
        k, v = rows_last(kp, kr, prompt_of), rows_last(vp, vr, prompt_of)
        got = kernels.rope_cache_attend(qkv, cos_t, sin_t, pos, heads, k, v, pstart[prompt_of], kp.shape[2] + t, 0.4)
        k_ref, v_ref, axis, col = (
            rows_last(kp, kr_ref, prompt_of),
            rows_last(vp, vr_ref, prompt_of),
            1,
            kp.shape[2] + t - 1,
        )
    else:  # response keys (rows, kv, steps, d): the new token in column t - 1
        k, v = kr, vr
        got = kernels.rope_cache_attend_shared(qkv, cos_t, sin_t, pos, heads, kp, vp, prompt_of, pstart, k, v, t, 0.4)
        k_ref, v_ref, axis, col = kr_ref, vr_ref, 2, t - 1
    assert torch.equal(v, v_ref)
    assert float((k - k_ref).abs().max()) < 1e-6  # the new column to rounding
    assert set((k != k_ref).nonzero()[:, axis].tolist()) <= {col}  # every other column untouched
    want = reference_attention(
        rope_reference(q, cos, sin)[:, :, None], kp, vp, prompt_of, pstart, kr_ref, vr_ref, t, 0.4
    )
    assert float((got.double() - want).abs().max()) < 1e-5


@pytest.mark.parametrize("fused, lanes", [(True, None), (True, 11), (False, None)])
@pytest.mark.parametrize("seed", range(3))
def test_rows_kernels_fork_rows_while_streaming_the_cache(fused, lanes, seed):
    """Rows 7 and 8 are new sequences parting from rows 1 and 4: the kernel copies those rows'
    columns into them as it reads the cache, so the call equals attention over a cache in
    which they had always held that history. The cache holds 11 rows; the call attends 9 (with
    ``lanes=11`` it runs over all 11, the last two with zero queries and keys)."""
    g, kp, vp, pstart, prompt_of, kr, vr = random_case(seed)
    heads, kv, d, t, width = 4, 2, 8, 4, kp.shape[2]
    src, dst = torch.tensor([1, 4]), torch.tensor([7, 8])
    ext_prompt, ext_kr, ext_vr = (
        torch.cat([prompt_of, prompt_of[src]]),
        torch.cat([kr, kr[src]]),
        torch.cat([vr, vr[src]]),
    )
    b, first = 9, pstart[torch.cat([prompt_of, prompt_of[src]])]
    qkv = torch.randn(b, (heads + 2 * kv) * d, generator=g)
    cos_t, sin_t = torch.randn(20, d, generator=g), torch.randn(20, d, generator=g)
    pos = torch.randint(0, 20, (b,), generator=g)
    q = rope_reference(qkv[:, : heads * d].view(b, heads, d), cos_t[pos][:, None], sin_t[pos][:, None])
    kn = rope_reference(qkv[:, heads * d : (heads + kv) * d].view(b, kv, d), cos_t[pos][:, None], sin_t[pos][:, None])
    vn = qkv[:, (heads + kv) * d :].view(b, kv, d)
    ext_kr[:, :, t - 1], ext_vr[:, :, t - 1] = kn, vn
    want_k, want_v = rows_last(kp, ext_kr, ext_prompt), rows_last(vp, ext_vr, ext_prompt)
    # the cache before the call: rows 7-10 hold stale numbers (a slot's earlier use), 9-10 unused
    k = torch.cat([rows_last(kp, kr, prompt_of), torch.randn(kv, width + kr.shape[2], d, 4, generator=g)], -1)
    v = torch.cat([rows_last(vp, vr, prompt_of), torch.randn(kv, width + kr.shape[2], d, 4, generator=g)], -1)
    after_k, after_v = k[..., 9:].clone(), v[..., 9:].clone()
    first11 = torch.cat([first, torch.zeros(2, dtype=torch.long)])
    col = width + t - 1
    if fused:
        got = kernels.rope_cache_attend(
            qkv, cos_t, sin_t, pos, heads, k, v, first11[: lanes or b], col + 1, 0.4, src, dst, lanes=lanes
        )
    else:  # the caller writes the new column
        k[:, col, :, :b], v[:, col, :, :b] = kn.permute(1, 2, 0), vn.permute(1, 2, 0)
        got = kernels.decode_attention(q[:, :, None] * 1.0, k, v, first11[:b], col + 1, 0.4, src, dst)
    want = reference_attention(q[:, :, None], kp, vp, ext_prompt, pstart, ext_kr, ext_vr, t, 0.4)
    assert float((got.double() - want).abs().max()) < 1e-5
    j0 = int(first.min())  # columns before every row's first are never read, nor copied
    assert float((k[:, j0 : col + 1, :, :b] - want_k[:, j0 : col + 1]).abs().max()) < 1e-6
    assert torch.equal(v[:, j0 : col + 1, :, :b], want_v[:, j0 : col + 1])
    if lanes:  # the extra lanes: zero keys and values in the new column, nothing else written
        assert not k[:, col, :, 9:].any() and not v[:, col, :, 9:].any()
        k[:, col, :, 9:], v[:, col, :, 9:] = after_k[:, col], after_v[:, col]
    assert torch.equal(k[..., 9:], after_k) and torch.equal(v[..., 9:], after_v)  # rows past the call untouched
    assert got.shape == (b, heads * d)


def test_rms_norm_matches_torch():
    g = torch.Generator().manual_seed(0)
    x, w = 3 * torch.randn(9, 40, generator=g), torch.randn(40, generator=g)
    want = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert float((kernels.rms_norm(x, w, 1e-6) - want).abs().max()) < 1e-5


def test_engine_takes_the_fused_path_only_where_it_applies(monkeypatch):
    """Llama in float32 decodes through ``decode_fused``; ``kernels='torch'`` and bf16
    autocast go through the tensor-op forward; ``kernels='numba'`` refuses a bf16 policy."""
    model, tok = build_tiny(0)
    calls = []
    fused = se.Decoder.decode_fused

    def spy(self, *args, **kwargs):
        calls.append(1)
        return fused(self, *args, **kwargs)

    monkeypatch.setattr(se.Decoder, "decode_fused", spy)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    prompts = [[tok.bos_token_id, 5, 6]]
    out = StaticEngine(model, eos_id=-1, pad_id=0).generate(prompts, 2, params)
    assert len(calls) == 4 and all(len(t) == 5 for t in out.tokens)  # 5 tokens: 4 fed back
    calls.clear()
    assert StaticEngine(model, eos_id=-1, pad_id=0, kernels="torch").generate(prompts, 2, params).tokens == out.tokens
    StaticEngine(model, eos_id=-1, pad_id=0, precision="bf16").generate(prompts, 2, params)
    assert calls == []
    with pytest.raises(ValueError, match="kernels='numba' runs float32 only"):
        StaticEngine(model, eos_id=-1, pad_id=0, precision="bf16", kernels="numba").generate(prompts, 2, params)
    with pytest.raises(ValueError, match=r"kernels: expected one of \('auto', 'numba', 'torch'\), got 'cuda'"):
        StaticEngine(model, eos_id=-1, pad_id=0, kernels="cuda")
    assert math.isfinite(sum(map(sum, out.logprobs)))


def test_kernels_keep_torch_thread_count():
    """numba's OpenMP pool must not change torch's intra-op threads (``train.threads``, the
    one-thread runs of ``--jobs``), whose count can change a run's numbers."""
    threads = torch.get_num_threads()
    model, tok = build_tiny(0)
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            StaticEngine(model, eos_id=-1, pad_id=0).generate(
                [[tok.bos_token_id, 5]], 2, SamplingParams(max_new_tokens=3)
            )
            assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.5])
def test_sample_tokens_draws_what_sample_next_draws(temperature):
    """Same uniforms -> same tokens as the tensor-op sampler, log-probs of the raw policy,
    pad on done rows, and never a token of probability 0 (a -inf logit)."""
    from creditrl.policy.engines.base import sample_next

    g = torch.Generator().manual_seed(int(temperature * 10))
    logits = torch.randn(300, 57, generator=g) * torch.tensor([0.5, 3.0, 12.0]).repeat(100)[:, None]
    logits[::7, 5:] = float("-inf")  # rows with only 5 tokens of mass
    done = torch.rand(300, generator=g) < 0.2
    state = g.get_state()
    want = sample_next(logits, SamplingParams(temperature=temperature), g)
    u = torch.Generator().set_state(state)
    tok, logp = kernels.sample_tokens(
        logits, temperature, torch.rand(300, 1, generator=u, dtype=torch.float64)[:, 0], done, 0
    )
    assert torch.equal(tok[~done], want[~done]) and bool((tok[done] == 0).all())
    assert bool((tok[::7] < 5).all())
    ref = torch.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0]
    assert float((logp - ref).abs().max()) < 1e-5


def test_polynomial_exp_matches_exp_to_float_rounding():
    """The attention's exponential (arithmetic only, so it vectorises) against float64 exp on
    [-87, 0], the range softmax feeds it; exp(0) is exactly 1."""
    import numba
    import numpy as np

    lib = kernels._need()

    @numba.njit
    def run(x):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = lib._exp_neg(x[i])
        return out

    x = np.concatenate([np.linspace(-87.0, 0.0, 200_001), -np.logspace(-8, 1.9, 1_000)]).astype(np.float32)
    rel = np.abs(run(x).astype(np.float64) / np.exp(x.astype(np.float64)) - 1)
    assert rel.max() < 2e-7
    assert run(np.zeros(1, dtype=np.float32))[0] == 1.0


def test_keep_rows_copies_the_kept_rows_of_the_written_columns():
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 2, 3, 9, 4, 11, generator=g)
    keep = torch.tensor([0, 3, 4, 10])
    got = kernels.keep_rows(cache, keep, 6)
    assert got.shape == (2, 2, 3, 9, 4, 4)
    assert torch.equal(got[:, :, :, :6], cache[:, :, :, :6][..., keep])
    roomy = kernels.keep_rows(cache, keep, 6, capacity=16)  # room for sequences that part later
    assert roomy.shape == (2, 2, 3, 9, 4, 16)
    assert torch.equal(roomy[:, :, :, :6, :, :4], got[:, :, :, :6])


def test_silu_mul_matches_torch():
    g = torch.Generator().manual_seed(0)
    gu = 4 * torch.randn(9, 2 * 37, generator=g)
    gu[0, :6] = torch.tensor([0.0, -0.0, 80.0, -80.0, 1e-30, -100.0])
    want = torch.nn.functional.silu(gu[:, :37]) * gu[:, 37:]
    got = kernels.silu_mul(gu)
    assert got.shape == (9, 37)
    # relative 1e-6, and absolute 1e-30 where silu underflows (x <= -87: exp is held at exp(-87))
    assert bool(((got - want).abs() <= 1e-6 * want.abs() + 1e-30).all())


def test_cache_layout_rows_unless_copying_prompts_reads_twice_what_sharing_reads():
    model, _ = build_tiny(0)
    engine = StaticEngine(model, eos_id=-1, pad_id=0)
    assert engine.rows_layout(128, 16, 15, 48)  # the bench: ratio 1.5
    assert not engine.rows_layout(8192, 1024, 80, 64)  # MC continuations of long prefixes: 2.7
    assert engine.rows_layout(8, 8, 500, 64)  # one sample per prompt: nothing to share
    assert StaticEngine(model, eos_id=-1, pad_id=0, cache_layout="rows").rows_layout(8192, 1024, 80, 64)
    assert not StaticEngine(model, eos_id=-1, pad_id=0, cache_layout="shared").rows_layout(128, 16, 15, 48)
    with pytest.raises(ValueError, match=r"cache_layout: expected one of \('auto', 'rows', 'shared'\), got 'x'"):
        StaticEngine(model, eos_id=-1, pad_id=0, cache_layout="x")


def test_cache_layout_follows_how_many_sequences_the_last_call_computed():
    """After a call whose samples stayed identical (greedy: one sequence per prompt) ``auto``
    takes the shared layout; after one whose samples all parted, the rows layout again."""
    model, _ = build_tiny(0)
    model.eval()
    prompts = [[1, 5, 6, 7], [1, 9, 10, 11]]
    engine = StaticEngine(model, eos_id=-1, pad_id=0)
    engine.generate(prompts, 8, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert engine.last_rows == (2 * 5, 16 * 5)  # two sequences, five decode steps
    assert not engine.rows_layout(128, 16, 15, 48)
    assert StaticEngine(model, eos_id=-1, pad_id=0, cache_layout="rows").rows_layout(128, 16, 15, 48)
    engine.generate(
        prompts, 8, SamplingParams(max_new_tokens=6, temperature=50.0), generator=torch.Generator().manual_seed(0)
    )
    computed, decoded = engine.last_rows
    assert computed > SHARED_LAYOUT_BELOW * decoded and engine.rows_layout(128, 16, 15, 48)
    every = StaticEngine(model, eos_id=-1, pad_id=0, share_rows=False)
    every.generate(prompts, 8, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert every.last_rows == (16 * 5, 16 * 5) and every.rows_layout(128, 16, 15, 48)


@pytest.mark.parametrize("seed", range(5))
def test_compiled_slot_regrouping_equals_the_tensor_op_one(seed):
    """kv_cache.Slots.step with and without the compiled pass: the same slots for every row,
    tokens fed, copies and slot count, over several steps with rows finishing on the way; and
    rows share a slot exactly when their prompt and live tokens so far are equal."""
    from creditrl.policy.engines.kv_cache import Slots

    g = torch.Generator().manual_seed(seed)
    prompt_of = torch.randint(0, 3, (24,), generator=g)
    prompt_of = torch.unique(prompt_of, return_inverse=True)[1]  # prompt ids 0..u-1
    slow, fast = Slots(prompt_of.clone(), True), Slots(prompt_of.clone(), True, compiled_step=True)
    history = [[int(p)] for p in prompt_of]
    live = torch.ones(24, dtype=torch.bool)
    for _ in range(6):
        tok = torch.randint(0, 3, (24,), generator=g)  # 3 tokens: many rows stay identical
        live &= torch.rand(24, generator=g) > 0.1
        want, got = slow.step(tok, live, 5, 4), fast.step(tok, live, 5, 4)
        assert torch.equal(slow.row, fast.row) and slow.n == fast.n and torch.equal(want[0], got[0])
        assert (want[1] is None) == (got[1] is None)
        if want[1] is not None:
            assert torch.equal(want[1], got[1]) and torch.equal(want[2], got[2])
        for i in range(24):
            if live[i]:
                history[i].append(int(tok[i]))
        for i in range(24):
            for j in range(24):
                if live[i] and live[j]:
                    assert (fast.row[i] == fast.row[j]) == (history[i] == history[j])
            if live[i]:
                assert int(got[0][fast.row[i]]) == int(tok[i])  # the slot is fed the row's token
