"""StaticEngine against HF ``generate``, HFEngine and full-forward references.

Models: the ``tiny`` preset trained briefly to emit eos (Llama), and small locally built Qwen2
(q/k/v bias, grouped-query attention), Qwen3 (q_norm/k_norm, head_dim != hidden/heads) and
Mistral configs whose weights are re-drawn at unit gain so next-token distributions are peaked
and context dependent (the default 0.02 init makes greedy decoding repeat the last token).
"""

import copy
import math

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from creditrl.policy.engines import HFEngine, SamplingParams, StaticEngine, left_pad, make_engine
from creditrl.policy.engines import static as se
from creditrl.policy.model import build_tiny

PAD = 0
VOCAB = 96
PROMPTS = [[1, 5, 6], [1], [1, 20, 30, 40, 50, 60, 70], [1, 14, 15, 16], [1, 9, 9]]  # lengths 3, 1, 7, 4, 3
STOP = 57  # a token the conftest ``peaked_tiny(0, 123)`` policy emits often: eos for mixed lengths


@pytest.fixture(autouse=True, params=["numba-rows", "numba-shared", "torch"])
def kernels(request, monkeypatch):
    """Every test runs with every decode path: the compiled kernels (the default where numba
    imports) with each KV cache layout (rows innermost, prompts shared per distinct prompt), and
    plain tensor ops (``kernels="torch"``)."""
    kernels, _, layout = request.param.partition("-")
    defaults = dict(StaticEngine.__init__.__kwdefaults__)
    defaults["kernels"] = kernels
    defaults["cache_layout"] = layout or "auto"
    monkeypatch.setattr(StaticEngine.__init__, "__kwdefaults__", defaults)
    return kernels


# ----------------------------------------------------------------------------- models


def peak(model, seed):
    """Re-draw every weight so distributions are peaked (matrices at unit gain, biases and
    norm gains random too, so the bias and q/k-norm paths matter)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
        model.model.norm.weight.mul_(3.0)
    return model.eval()


def small_config(cls, **extra):
    return cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )


@pytest.fixture(scope="module")
def trained_tiny():
    """The tiny preset after 40 SFT steps on strings ending in eos: it stops at varied times."""
    model, tok = build_tiny(0)
    texts = ["12+7=19", "3*4=12", "hello world", "ab", "xyz=1000", "q"]
    seqs = [[tok.bos_token_id, *tok.encode(s, add_special_tokens=False), tok.eos_token_id] for s in texts]
    ids, attn = left_pad(seqs, tok.pad_token_id)
    labels = ids.masked_fill(attn == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(40):
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    assert float(loss.detach()) < 1.0
    prompts = [seqs[0][:4], seqs[2][:3], seqs[4][:6], [tok.bos_token_id], seqs[1][:2], [tok.bos_token_id, 30, 31]]
    return model, tok, prompts


@pytest.fixture(scope="module")
def qwen2():
    model = peak(Qwen2ForCausalLM(small_config(Qwen2Config)), 1)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    return model, 91  # eos: a token its greedy continuations reach at different steps


@pytest.fixture(scope="module")
def qwen3():
    model = peak(Qwen3ForCausalLM(small_config(Qwen3Config, head_dim=16)), 2)
    assert model.model.layers[0].self_attn.q_norm is not None
    return model, 17


@pytest.fixture(scope="module")
def peaked(peaked_tiny):
    model, tok = peaked_tiny(0, 123)
    return model, tok


# ----------------------------------------------------------------------------- references


def hf_greedy(model, prompts, max_new, eos):
    """HF ``generate`` (greedy, left padding, attention mask), each row cut after its first eos."""
    ids, attn = left_pad(prompts, PAD)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=False,
            max_new_tokens=max_new,
            pad_token_id=PAD,
            eos_token_id=eos,
        )
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        if eos in row:
            rows.append(row[: row.index(eos) + 1])
        else:
            assert len(row) == max_new
            rows.append(row)
    return rows


def full_logits(model, seq):
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0].float()


def reference_logprobs(model, prompt, tokens):
    """log_softmax of one full forward over prompt + response, at each generated token."""
    logp = torch.log_softmax(full_logits(model, list(prompt) + list(tokens)), dim=-1)
    p = len(prompt)
    return [float(logp[p - 1 + i, t]) for i, t in enumerate(tokens)]


def max_abs_diff(a, b):
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def expected_first_token_probs(model, prompt, temperature, top_p):
    """The distribution sample_next draws from: tempered softmax, then the nucleus (the smallest
    prefix of the sorted probabilities whose mass reaches top_p), renormalised."""
    probs = torch.softmax(full_logits(model, prompt)[-1].double() / temperature, -1)
    sorted_p, order = probs.sort(descending=True)
    keep = (sorted_p.cumsum(0) - sorted_p) < top_p
    kept = torch.zeros_like(probs, dtype=torch.bool)
    kept[order[keep]] = True
    target = torch.where(kept, probs, torch.zeros_like(probs))
    return target / target.sum(), kept


# ----------------------------------------------------------------------------- 1. greedy == HF generate


def _greedy_case(request, name):
    if name == "tiny":
        model, tok, prompts = request.getfixturevalue("trained_tiny")
        return model, prompts, tok.eos_token_id, 8
    model, eos = request.getfixturevalue(name)
    return model, PROMPTS, eos, 16


@pytest.mark.parametrize("name", ["tiny", "qwen2", "qwen3"])
def test_greedy_tokens_equal_hf_generate(request, name):
    model, prompts, eos, max_new = _greedy_case(request, name)
    expected = hf_greedy(model, prompts, max_new, eos)
    # the batch exercises padding and eos: distinct rows, stopped and unstopped, varied lengths
    assert len({tuple(t) for t in expected}) == len(prompts)
    assert any(eos in t for t in expected) and not all(eos in t for t in expected)
    assert len({len(t) for t in expected}) >= 3
    gen = StaticEngine(model, eos_id=eos, pad_id=PAD).generate(
        prompts, 1, SamplingParams(max_new_tokens=max_new, temperature=0.0)
    )
    assert gen.tokens == expected
    assert gen.finished == [eos in t for t in expected]
    assert gen.prompt_ids == [list(p) for p in prompts]
    assert [len(lp) for lp in gen.logprobs] == [len(t) for t in expected]


def test_mistral_within_window_equals_hf_and_beyond_window_is_refused():
    model = peak(MistralForCausalLM(small_config(MistralConfig, sliding_window=24)), 3)
    engine = StaticEngine(model, eos_id=2, pad_id=PAD)
    gen = engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert gen.tokens == hf_greedy(model, PROMPTS, 12, 2)
    with pytest.raises(ValueError, match="sliding_window=24"):
        engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=20, temperature=0.0))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_sliding_window_models_are_refused_and_auto_falls_back(arch):
    cls, cfg_cls, extra = (
        (Qwen2ForCausalLM, Qwen2Config, {}) if arch == "qwen2" else (Qwen3ForCausalLM, Qwen3Config, {"head_dim": 16})
    )
    cfg = small_config(cfg_cls, use_sliding_window=True, sliding_window=4, max_window_layers=0, **extra)
    assert set(cfg.layer_types) == {"sliding_attention"}
    model = peak(cls(cfg), 1)
    prompts = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 20, 30]]
    with pytest.raises(ValueError, match="sliding-window layers"):
        StaticEngine(model, eos_id=2, pad_id=PAD)
    engine = make_engine(model, eos_id=2, pad_id=PAD, kind="auto")  # falls back to the HF engine
    assert isinstance(engine, HFEngine)
    gen = engine.generate(prompts, 1, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert gen.tokens == hf_greedy(model, prompts, 12, 2)


# ----------------------------------------------------------------------------- 2. log-probs


@pytest.mark.parametrize("name", ["peaked", "qwen2", "qwen3"])
def test_logprobs_are_raw_policy_logprobs_under_tempered_nucleus_sampling(request, name):
    if name == "peaked":
        model, eos = request.getfixturevalue("peaked")[0], STOP
    else:
        model, eos = request.getfixturevalue(name)
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.8)
    gen = StaticEngine(model, eos_id=eos, pad_id=PAD).generate(
        PROMPTS, 3, params, generator=torch.Generator().manual_seed(7)
    )
    assert len({tuple(t) for t in gen.tokens}) > len(PROMPTS)  # samples of a prompt differ
    worst_tempered = 0.0
    for prompt, toks, lps in zip(gen.prompt_ids, gen.tokens, gen.logprobs):
        assert len(lps) == len(toks) >= 1
        assert max_abs_diff(lps, reference_logprobs(model, prompt, toks)) < 1e-5
        logits = full_logits(model, prompt + toks)[len(prompt) - 1 :]
        tempered = torch.log_softmax(logits / params.temperature, -1)
        worst_tempered = max(worst_tempered, max_abs_diff(lps, [float(tempered[i, x]) for i, x in enumerate(toks)]))
    # the check has power: the tempered distribution's log-probs are far from the returned ones
    assert worst_tempered > 1e-2


# ----------------------------------------------------------------------------- 3. same stream as HFEngine


@pytest.mark.parametrize("name", ["peaked", "qwen3"])
def test_sampled_tokens_match_hf_engine_for_the_same_seed(request, name):
    if name == "peaked":
        model, eos = request.getfixturevalue("peaked")[0], STOP
    else:
        model, eos = request.getfixturevalue(name)
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    kw = dict(eos_id=eos, pad_id=PAD)
    ref = HFEngine(model, **kw).generate(PROMPTS, 8, params, generator=torch.Generator().manual_seed(11))
    gen = StaticEngine(model, **kw).generate(PROMPTS, 8, params, generator=torch.Generator().manual_seed(11))
    assert gen.prompt_index == ref.prompt_index and gen.prompt_ids == ref.prompt_ids
    same = [a == b for a, b in zip(gen.tokens, ref.tokens)]
    assert sum(same) >= 0.99 * len(same)
    for a, b, la, lb, fa, fb in zip(gen.tokens, ref.tokens, gen.logprobs, ref.logprobs, gen.finished, ref.finished):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert max_abs_diff(la[:k], lb[:k]) < 1e-5
        if a == b:
            assert fa == fb
    # non-trivial: rows differ within a prompt, and some but not all stop at eos
    assert len({tuple(t) for t in gen.tokens[:8]}) > 1
    assert any(gen.finished) and not all(gen.finished)
    # a different seed gives different samples
    other = StaticEngine(model, **kw).generate(PROMPTS, 8, params, generator=torch.Generator().manual_seed(12))
    assert other.tokens != gen.tokens


# ----------------------------------------------------------------------------- 4. sampling distribution


@pytest.mark.parametrize("temperature, top_p", [(0.5, 1.0), (1.0, 0.6), (0.5, 0.6)])
def test_first_token_frequencies_match_tempered_nucleus_distribution(peaked, temperature, top_p):
    model, _ = peaked
    prompt = [1, 14, 15, 16]
    n = 4000
    gen = StaticEngine(model, eos_id=STOP, pad_id=PAD).generate(
        [prompt],
        n,
        SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p),
        generator=torch.Generator().manual_seed(5),
    )
    assert all(len(t) == 1 for t in gen.tokens)
    draws = torch.tensor([t[0] for t in gen.tokens])
    freq = torch.bincount(draws, minlength=VOCAB + 3).double()[: full_logits(model, prompt).shape[-1]] / n
    target, kept = expected_first_token_probs(model, prompt, temperature, top_p)
    tv = 0.5 * float((freq - target).abs().sum())
    assert tv < 0.05
    assert float(freq[~kept].sum()) == 0.0  # nothing outside the nucleus
    # the test has power: the raw distribution is far from what was sampled
    raw = torch.softmax(full_logits(model, prompt)[-1].double(), -1)
    assert 0.5 * float((freq - raw).abs().sum()) > 0.15
    if top_p < 1.0:
        assert 2 <= int(kept.sum()) <= 6
    # and each returned log-prob is the raw (untempered, untruncated) one
    lp = torch.tensor([row[0] for row in gen.logprobs], dtype=torch.double)
    assert float((lp - raw.log()[draws]).abs().max()) < 1e-5


# ----------------------------------------------------------------------------- 5. budgets


@pytest.mark.parametrize(
    "temperature, budgets",
    [(0.0, [3, 12, 8, 5, 2]), (0.0, [3, 12, 6, 5, 2]), (1.0, [3, 12, 1, 5, 2]), (1.0, [2, 4, 1, 3, 4])],
)
def test_budgets_equal_truncating_an_unbudgeted_run(peaked, temperature, budgets):
    model, _ = peaked
    engine = StaticEngine(model, eos_id=STOP, pad_id=PAD)
    params = SamplingParams(max_new_tokens=10, temperature=temperature)
    full = engine.generate(PROMPTS, 4, params, generator=torch.Generator().manual_seed(7))
    cut = engine.generate(PROMPTS, 4, params, generator=torch.Generator().manual_seed(7), budgets=budgets)
    hf_cut = HFEngine(model, eos_id=STOP, pad_id=PAD).generate(
        PROMPTS, 4, params, generator=torch.Generator().manual_seed(7), budgets=budgets
    )
    truncated = 0
    for i, (toks, lps) in enumerate(zip(full.tokens, full.logprobs)):
        lim = min(10, budgets[full.prompt_index[i]])
        assert cut.tokens[i] == toks[:lim]
        assert max_abs_diff(cut.logprobs[i], lps[:lim]) < 1e-5  # batch shapes differ: rounding
        assert cut.finished[i] == (STOP in toks[:lim])
        assert len(cut.tokens[i]) <= lim
        truncated += len(toks) > lim
    assert truncated > 0  # some budget actually cut a row
    # finished matters: a row ends at eos within its budget, or a budget cuts a row before its eos
    assert any(cut.finished) or any(f and not c for f, c in zip(full.finished, cut.finished))
    assert not all(cut.finished)
    assert cut.tokens == hf_cut.tokens and cut.finished == hf_cut.finished


# ----------------------------------------------------------------------------- 6. shared prefix, compaction


def test_duplicate_prompts_match_hf_engine(peaked):
    model, _ = peaked
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[0], PROMPTS[3], PROMPTS[2], PROMPTS[0]]
    kw = dict(eos_id=STOP, pad_id=PAD)
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    ref = HFEngine(model, **kw).generate(prompts, 2, greedy)
    gen = StaticEngine(model, **kw).generate(prompts, 2, greedy)
    assert gen.tokens == ref.tokens and gen.finished == ref.finished
    assert gen.prompt_ids == ref.prompt_ids
    for a, b in zip(gen.logprobs, ref.logprobs):
        assert max_abs_diff(a, b) < 1e-5
    assert gen.tokens[0] == gen.tokens[4] == gen.tokens[10]  # same prompt, same greedy answer
    # sampled: duplicates are prefilled once but still sampled independently, as in HFEngine
    sampled = SamplingParams(max_new_tokens=10, temperature=1.0)
    ref = HFEngine(model, **kw).generate(prompts, 2, sampled, generator=torch.Generator().manual_seed(3))
    gen = StaticEngine(model, **kw).generate(prompts, 2, sampled, generator=torch.Generator().manual_seed(3))
    assert gen.tokens == ref.tokens
    assert len({tuple(gen.tokens[i]) for i in (0, 1, 4, 5, 10, 11)}) > 1


def simulate_cache_rows(tokens, compact_at):
    """Rows the decode forward should run at each step under the compaction rule."""
    n = len(tokens)
    active, sizes = n, []
    for step in range(max(len(t) for t in tokens) - 1):
        live = sum(len(t) > step + 1 for t in tokens)
        if live <= compact_at * active:
            active = live
        sizes.append(active)
    return sizes


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compaction_does_not_change_outputs(monkeypatch, peaked, temperature):
    model, _ = peaked
    calls = []
    forward, fused = se.Decoder.forward, se.Decoder.decode_fused

    def spy(self, ids, *args, **kwargs):
        calls.append(ids.shape)
        return forward(self, ids, *args, **kwargs)

    def spy_fused(self, tok, *args, **kwargs):
        calls.append((tok.shape[0], 1))
        return fused(self, tok, *args, **kwargs)

    monkeypatch.setattr(se.Decoder, "forward", spy)
    monkeypatch.setattr(se.Decoder, "decode_fused", spy_fused)
    params = SamplingParams(max_new_tokens=14, temperature=temperature)
    results, sizes = {}, {}
    for c in (0.75, 1.0, 0.25):
        calls.clear()
        # share_rows off: every cache row goes through the step (test_identical_rows_... below)
        engine = StaticEngine(model, eos_id=STOP, pad_id=PAD, compact_at=c, share_rows=False)
        results[c] = engine.generate(PROMPTS, 3, params, generator=torch.Generator().manual_seed(9))
        assert calls[0][0] == len(PROMPTS)  # shared prefill: one row per distinct prompt
        sizes[c] = [shape[0] for shape in calls[1:]]
        assert all(shape[1] == 1 for shape in calls[1:])
    base = results[0.75]
    assert len({len(t) for t in base.tokens}) >= 2 and any(base.finished) and not all(base.finished)
    for c in (1.0, 0.25):
        assert results[c].tokens == base.tokens
        assert results[c].finished == base.finished
        for a, b in zip(results[c].logprobs, base.logprobs):
            assert max_abs_diff(a, b) < 1e-5
    for c, s in sizes.items():
        assert s == simulate_cache_rows(base.tokens, c), c
    assert sizes[1.0] != sizes[0.25]  # compaction happened at different points
    assert sizes[1.0][-1] < len(base.tokens)


def slot_steps(prompts, n, tokens):
    """Reference count for share_rows without compaction: (slot-steps computed, row-steps
    decoded). The rows of a prompt start in one slot; at each decode step the rows still
    decoding (a row of length L decodes after drawing its token s while L > s + 1) split their
    slot by the token they drew: one group keeps it, each other takes a new slot. Done rows
    stay where they are, and a slot once taken is computed until the cache drops it."""
    rows = [tuple(p) for p in prompts for _ in range(n)]
    first_slot = {}
    slot = [first_slot.setdefault(r, len(first_slot)) for r in rows]
    used, computed = len(first_slot), 0
    steps = max(len(t) for t in tokens) - 1  # the last drawn token is never fed back
    for s in range(steps):
        children = {}
        for i in range(len(rows)):
            if len(tokens[i]) > s + 1:
                children.setdefault(slot[i], {}).setdefault(tokens[i][s], []).append(i)
        for groups in children.values():
            for tok in sorted(groups)[1:]:
                for i in groups[tok]:
                    slot[i] = used
                used += 1
        computed += used
    return computed, steps * len(rows)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_identical_rows_are_decoded_once_with_unchanged_outputs(monkeypatch, peaked, temperature):
    model, _ = peaked
    prompts = PROMPTS + [PROMPTS[3]]  # a duplicate prompt: its rows start as one sequence too
    params = SamplingParams(max_new_tokens=12, temperature=temperature)
    widths = []
    fused, forward = se.Decoder.decode_fused, se.Decoder.forward
    monkeypatch.setattr(
        se.Decoder, "decode_fused", lambda self, tok, *a: widths.append(len(tok)) or fused(self, tok, *a)
    )
    monkeypatch.setattr(se.Decoder, "forward", lambda self, ids, *a: widths.append(len(ids)) or forward(self, ids, *a))
    kw = dict(eos_id=STOP, pad_id=PAD)
    for compact_at in (0.75, 1e-9):  # with compaction, and without (every row decodes every step)
        off = StaticEngine(model, **kw, compact_at=compact_at, share_rows=False)
        on = StaticEngine(model, **kw, compact_at=compact_at)
        ref = off.generate(prompts, 4, params, generator=torch.Generator().manual_seed(5))
        widths.clear()
        gen = on.generate(prompts, 4, params, generator=torch.Generator().manual_seed(5))
        assert gen.tokens == ref.tokens and gen.finished == ref.finished
        for a, b in zip(gen.logprobs, ref.logprobs):
            assert max_abs_diff(a, b) < 1e-6
        computed, decoded = on.last_rows
        assert computed == sum(widths[1:]) < decoded == off.last_rows[0] == off.last_rows[1]
    assert any(gen.finished) and len({len(t) for t in gen.tokens}) >= 2
    assert on.last_rows == slot_steps(prompts, 4, gen.tokens)
    if temperature == 0.0:  # greedy: the samples of a prompt never part
        assert on.last_rows[0] == len({tuple(p) for p in prompts}) * (max(len(t) for t in gen.tokens) - 1)


# ----------------------------------------------------------------------------- 7. errors, make_engine


def test_bad_requests_raise(peaked):
    model, _ = peaked
    engine = StaticEngine(model, eos_id=STOP, pad_id=PAD)
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="n >= 1, got 1 prompts, n=0"):
        engine.generate([[1]], 0, params)
    with pytest.raises(ValueError, match="got 0 prompts"):
        engine.generate([], 1, params)
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        engine.generate([[1, 4], []], 1, params)
    with pytest.raises(ValueError, match=r"budgets: need one budget >= 1 per prompt \(2\), got \[1\]"):
        engine.generate([[1], [1, 2]], 1, params, budgets=[1])
    with pytest.raises(ValueError, match=r"budgets: .*got \[2, 0\]"):
        engine.generate([[1], [1, 2]], 1, params, budgets=[2, 0])
    for c in (0.0, 1.5):
        with pytest.raises(ValueError, match="compact_at must be in"):
            StaticEngine(model, eos_id=STOP, pad_id=PAD, compact_at=c)


def test_unsupported_model_and_make_engine(peaked):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=16, n_layer=1, n_head=2)).eval()
    with pytest.raises(ValueError, match="gpt2"):
        StaticEngine(gpt2, eos_id=2, pad_id=PAD)
    with pytest.raises(ValueError, match="gpt2"):
        make_engine(gpt2, eos_id=2, pad_id=PAD, kind="static")
    auto = make_engine(gpt2, eos_id=2, pad_id=PAD, kind="auto")
    assert type(auto) is HFEngine and auto.eos_id == 2 and auto.pad_id == PAD
    model, _ = peaked
    static = make_engine(model, eos_id=STOP, pad_id=PAD)  # auto, supported
    assert type(static) is StaticEngine and static.eos_id == STOP and static.pad_id == PAD
    assert type(make_engine(model, eos_id=STOP, pad_id=PAD, kind="hf")) is HFEngine
    assert type(make_engine(model, eos_id=STOP, pad_id=PAD, kind="static")) is StaticEngine
    with pytest.raises(ValueError, match="bogus"):
        make_engine(model, eos_id=STOP, pad_id=PAD, kind="bogus")


# ----------------------------------------------------------------------------- 8. fresh weights


def test_weights_are_read_at_every_call(trained_tiny):
    base, tok, prompts = trained_tiny
    model = copy.deepcopy(base)
    eos = tok.eos_token_id
    engine = StaticEngine(model, eos_id=eos, pad_id=PAD)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate(prompts, 1, params).tokens
    assert before == hf_greedy(model, prompts, 8, eos)
    with torch.no_grad():  # a change to the (tied) output matrix's eos row
        model.lm_head.weight[eos] -= 100.0
    after = engine.generate(prompts, 1, params).tokens
    assert after != before
    assert after == hf_greedy(model, prompts, 8, eos)
    with torch.no_grad():  # a change inside a layer (its weights are fused into q|k|v and gate|up)
        model.model.layers[0].self_attn.k_proj.weight.mul_(-3.0)
        model.model.layers[1].mlp.up_proj.weight.add_(0.5)
    third = engine.generate(prompts, 1, params).tokens
    assert third != after
    assert third == hf_greedy(model, prompts, 8, eos)


# ----------------------------------------------------------------------------- 9. groups of samples


@pytest.mark.parametrize("name", ["tiny", "qwen2", "qwen3"])
@pytest.mark.parametrize("n", [3, 8])
def test_groups_of_samples_match_hf_engine(request, name, n):
    """n samples per prompt (one prefill per prompt, rows finishing early and compacted) give
    HFEngine's tokens and log-probs, greedy and sampled."""
    if name == "tiny":
        model, tok, prompts = request.getfixturevalue("trained_tiny")
        eos, pad = tok.eos_token_id, tok.pad_token_id
    else:
        (model, eos), pad, prompts = request.getfixturevalue(name), PAD, PROMPTS
    static, hf = StaticEngine(model, eos_id=eos, pad_id=pad), HFEngine(model, eos_id=eos, pad_id=pad)
    for params, seed in [
        (SamplingParams(max_new_tokens=10, temperature=0.0), 0),
        (SamplingParams(max_new_tokens=10), 5),
    ]:
        a = static.generate(prompts, n, params, generator=torch.Generator().manual_seed(seed))
        b = hf.generate(prompts, n, params, generator=torch.Generator().manual_seed(seed))
        assert a.tokens == b.tokens and a.finished == b.finished
        assert max(abs(x - y) for ra, rb in zip(a.logprobs, b.logprobs) for x, y in zip(ra, rb)) < 1e-5
    if params.temperature > 0:
        assert len({tuple(t) for t in a.tokens}) > len(prompts)  # samples of one prompt differ


# ----------------------------------------------------------------------------- long responses


def test_long_responses_match_hf_generate_and_a_full_forward(peaked):
    """1,000 generated tokens per row: greedy tokens equal HF ``generate``'s, and the log-probs the
    static engine returns with its samples equal a full forward over prompt + response."""
    model, tok = peaked
    prompts = [[tok.bos_token_id, 30, 31], [tok.bos_token_id, 40], [tok.bos_token_id, 50, 51, 52, 53]]
    n = 1000
    ids, attn = left_pad(prompts, PAD)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=PAD
        )
    expected = out[:, ids.shape[1] :].tolist()
    engine = StaticEngine(model, eos_id=-1, pad_id=PAD)
    greedy = engine.generate(prompts, 1, SamplingParams(max_new_tokens=n, temperature=0.0))
    assert [len(t) for t in greedy.tokens] == [n] * 3
    assert greedy.tokens == expected
    sampled = engine.generate(
        prompts, 2, SamplingParams(max_new_tokens=n, temperature=1.0), generator=torch.Generator().manual_seed(0)
    )
    for prompt, tokens, logprobs in zip(sampled.prompt_ids, sampled.tokens, sampled.logprobs):
        assert len(tokens) == n
        assert max_abs_diff(logprobs, reference_logprobs(model, prompt, tokens)) < 2e-4


# ----------------------------------------------------------------------------- oneDNN products


@pytest.mark.parametrize("name", ["tiny", "qwen2"])
def test_onednn_products_give_hf_engines_tokens_and_logprobs(request, monkeypatch, kernels, name):
    """The compiled step's products through oneDNN on weights reordered once per call (the default
    from hidden 256; forced here on small models, qwen2 for the bias path) give HFEngine's tokens and
    log-probs, greedy and sampled; the tensor-op step (kernels="torch") never reorders."""
    from creditrl.policy.engines.decoder import Decoder

    if name == "tiny":
        model, tok, prompts = request.getfixturevalue("trained_tiny")
        eos, pad = tok.eos_token_id, tok.pad_token_id
    else:
        (model, eos), pad, prompts = request.getfixturevalue(name), PAD, PROMPTS
    packed_for, prepack = [], Decoder.prepack
    monkeypatch.setattr(Decoder, "prepack", lambda self, rows: (packed_for.append(rows), prepack(self, rows))[1])
    static, hf = StaticEngine(model, eos_id=eos, pad_id=pad, products="onednn"), HFEngine(model, eos_id=eos, pad_id=pad)
    cases = [(SamplingParams(max_new_tokens=10, temperature=0.0), 0), (SamplingParams(max_new_tokens=10), 5)]
    for params, seed in cases:
        a = static.generate(prompts, 4, params, generator=torch.Generator().manual_seed(seed))
        b = hf.generate(prompts, 4, params, generator=torch.Generator().manual_seed(seed))
        assert a.tokens == b.tokens and a.finished == b.finished
        assert max(abs(x - y) for ra, rb in zip(a.logprobs, b.logprobs) for x, y in zip(ra, rb)) < 1e-5
    assert packed_for == ([] if kernels == "torch" else [4 * len(prompts)] * 2)


def test_onednn_products_are_chosen_from_hidden_256_and_named_choices_only(peaked):
    from creditrl.policy.engines.decoder import ONEDNN_FROM_HIDDEN, onednn_available

    model, tok = peaked
    auto = StaticEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert ONEDNN_FROM_HIDDEN == 256 and not auto.use_onednn(128) and auto.use_onednn(384) == onednn_available()
    assert not StaticEngine(model, eos_id=2, pad_id=0, products="torch").use_onednn(4096)
    with pytest.raises(ValueError, match="products: expected one of \\('auto', 'torch', 'onednn'\\), got 'mkl'"):
        StaticEngine(model, eos_id=2, pad_id=0, products="mkl")
