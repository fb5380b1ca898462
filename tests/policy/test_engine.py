"""HFEngine, sample_next, left_pad and SamplingParams against slow full-forward references."""

import math

import pytest
import torch

from creditrl.policy.engines import HFEngine, SamplingParams, left_pad, positions_from_mask
from creditrl.policy.engines.base import sample_next

PROMPTS = [[1, 5, 6], [1], [1, 20, 30, 40, 50, 60, 70], [1, 14, 15, 16]]  # lengths 3, 1, 7, 4
STOP = 57  # a token the fixture policy emits often: used as the engine's eos to get mixed lengths


@pytest.fixture(scope="module")
def policy(peaked_tiny):
    """A tiny Llama with peaked, context-dependent next-token distributions (see conftest)."""
    return peaked_tiny(0, 123)


def full_logits(model, seq):
    """Logits (L, V) of one unpadded sequence, no cache."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq])).logits[0].float()


def reference_greedy(model, prompt, max_new, eos):
    """Re-run the whole model on the whole sequence every step and take the argmax."""
    seq = list(prompt)
    out = []
    for _ in range(max_new):
        nxt = int(full_logits(model, seq)[-1].argmax())
        out.append(nxt)
        seq.append(nxt)
        if nxt == eos:
            break
    return out


def reference_logprobs(model, prompt, tokens):
    """log_softmax of one full forward over prompt + response, at each generated token."""
    logp = torch.log_softmax(full_logits(model, list(prompt) + list(tokens)), dim=-1)
    p = len(prompt)
    return [float(logp[p - 1 + i, t]) for i, t in enumerate(tokens)]


# ----------------------------------------------------------------------------- left_pad


def test_left_pad_layout_and_positions():
    ids, mask = left_pad([[7, 8, 9], [5], []], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == torch.long and mask.dtype == torch.long
    assert positions_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0]]
    _, mask2 = left_pad([[1, 2], [3, 4, 5, 6]], pad_id=9)
    assert positions_from_mask(mask2).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


# ----------------------------------------------------------------------------- (a) greedy


def test_greedy_matches_full_forward_reference_with_left_padding(policy):
    model, tok = policy
    engine = HFEngine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    gen = engine.generate(PROMPTS, 1, params)
    expected = [reference_greedy(model, p, 10, STOP) for p in PROMPTS]
    assert gen.tokens == expected
    # the batch is not trivially uniform: different rows, and both stopped and unstopped rows
    assert len({tuple(t) for t in expected}) == len(PROMPTS)
    assert gen.finished == [STOP in t for t in expected]
    assert any(gen.finished) and not all(gen.finished)


def test_greedy_alone_equals_greedy_in_a_padded_batch(policy):
    model, tok = policy
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    batched = engine.generate(PROMPTS, 1, params)
    for i, p in enumerate(PROMPTS):
        alone = engine.generate([p], 1, params)
        assert alone.tokens[0] == batched.tokens[i]
        assert alone.logprobs[0] == pytest.approx(batched.logprobs[i], abs=1e-5)


def test_generate_restores_training_mode(policy):
    model, tok = policy
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.train()
    try:
        engine.generate([[1]], 1, SamplingParams(max_new_tokens=2, temperature=0.0))
        assert model.training
    finally:
        model.eval()


# ----------------------------------------------------------------------------- (b) logprobs


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=12, temperature=1.0),
        SamplingParams(max_new_tokens=12, temperature=0.7),
        SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.8),
        SamplingParams(max_new_tokens=12, temperature=0.0),
    ],
    ids=["t1", "t0.7", "t0.7-p0.8", "greedy"],
)
def test_logprobs_are_raw_policy_logprobs_of_full_forward(policy, params):
    model, tok = policy
    engine = HFEngine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    gen = engine.generate(PROMPTS, 2, params, generator=torch.Generator().manual_seed(7))
    for prompt, toks, lps in zip(gen.prompt_ids, gen.tokens, gen.logprobs):
        assert len(lps) == len(toks)
        ref = reference_logprobs(model, prompt, toks)
        assert max(abs(a - b) for a, b in zip(lps, ref)) < 1e-5
    if params.temperature not in (0.0, 1.0):
        # the check has power: log-probs of the temperature-scaled distribution differ
        prompt, toks, lps = gen.prompt_ids[0], gen.tokens[0], gen.logprobs[0]
        logits = full_logits(model, prompt + toks)[len(prompt) - 1 :]
        scaled = torch.log_softmax(logits / params.temperature, -1)
        scaled_lp = [float(scaled[i, x]) for i, x in enumerate(toks)]
        assert max(abs(a - b) for a, b in zip(lps, scaled_lp)) > 1e-2


# ----------------------------------------------------------------------------- (c) eos


def test_rows_stop_at_eos(policy):
    model, tok = policy
    engine = HFEngine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    gen = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=10), generator=torch.Generator().manual_seed(3))
    assert any(gen.finished) and not all(gen.finished)
    for toks, lps, done in zip(gen.tokens, gen.logprobs, gen.finished):
        assert len(lps) == len(toks)
        if done:
            assert toks[-1] == STOP
            assert STOP not in toks[:-1]  # nothing after the first eos
            assert len(toks) <= 10
        else:
            assert STOP not in toks
            assert len(toks) == 10


def test_generation_ends_early_when_every_row_finished(policy):
    model, tok = policy
    # greedy from prompt 0 with eos = its first greedy token: one step and done
    first = reference_greedy(model, PROMPTS[0], 1, -1)[0]
    engine = HFEngine(model, eos_id=first, pad_id=tok.pad_token_id)
    gen = engine.generate([PROMPTS[0]], 3, SamplingParams(max_new_tokens=20, temperature=0.0))
    assert gen.tokens == [[first]] * 3
    assert gen.finished == [True] * 3


# ----------------------------------------------------------------------------- n, prompt order


def test_n_samples_are_prompt_major(policy):
    model, tok = policy
    engine = HFEngine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    gen = engine.generate(PROMPTS[:3], 3, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert gen.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert gen.prompt_ids == [PROMPTS[i] for i in gen.prompt_index]
    for i, toks in zip(gen.prompt_index, gen.tokens):
        assert toks == reference_greedy(model, PROMPTS[i], 6, STOP)
    n_sampled = engine.generate(
        PROMPTS[:2], 5, SamplingParams(max_new_tokens=6), generator=torch.Generator().manual_seed(0)
    )
    assert n_sampled.prompt_index == [0] * 5 + [1] * 5
    assert len(n_sampled.tokens) == len(n_sampled.logprobs) == len(n_sampled.finished) == 10
    assert len({tuple(t) for t in n_sampled.tokens[:5]}) > 1  # samples of one prompt differ


# ----------------------------------------------------------------------------- (d) sample_next


def top_p_draws(probs, top_p, temperature=1.0, n=4000, seed=0):
    logits = torch.log(torch.tensor(probs, dtype=torch.float32)).expand(n, -1).clone()
    draws = sample_next(
        logits, SamplingParams(temperature=temperature, top_p=top_p), torch.Generator().manual_seed(seed)
    )
    return draws


# probabilities in a shuffled order so that the sort matters; sorted: .4 .3 .15 .1 .05
PROBS = [0.1, 0.4, 0.05, 0.3, 0.15]


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (1e-6, {1}),  # the top token is always kept
        (0.39, {1}),
        (0.41, {1, 3}),
        (0.69, {1, 3}),
        (0.71, {1, 3, 4}),
        (0.84, {1, 3, 4}),
        (0.86, {1, 3, 4, 0}),
        (0.94, {1, 3, 4, 0}),
        (0.96, {0, 1, 2, 3, 4}),
        (1.0, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_keeps_smallest_prefix_reaching_top_p(top_p, kept):
    draws = top_p_draws(PROBS, top_p)
    assert set(draws.tolist()) == kept
    # the kept tokens are sampled in proportion to their renormalised probabilities
    mass = sum(PROBS[i] for i in kept)
    for i in kept:
        freq = float((draws == i).float().mean())
        p = PROBS[i] / mass
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / len(draws)) + 1e-9


@pytest.mark.parametrize("top_p, n_kept", [(0.25, 1), (0.5, 2), (0.5 + 1e-6, 3), (0.75, 3), (1.0, 4)])
def test_top_p_mass_exactly_at_top_p_is_enough(top_p, n_kept):
    # four equal logits give probabilities of exactly 0.25 and exact cumulative sums, so a
    # prefix whose mass equals top_p must stop there ("reaching", not "exceeding")
    draws = sample_next(torch.zeros(4000, 4), SamplingParams(top_p=top_p), torch.Generator().manual_seed(2))
    assert len(set(draws.tolist())) == n_kept


def test_top_p_applies_to_temperature_scaled_probs():
    # at T=0.5 the probs become (.4,.3,.15,.1,.05)^2 renormalised: the top two hold 0.25/0.285 ~ 0.877
    sq = [p * p for p in PROBS]
    top2 = (sq[1] + sq[3]) / sum(sq)
    assert set(top_p_draws(PROBS, top2 - 0.01, temperature=0.5).tolist()) == {1, 3}
    # at T=1 the same top_p (~0.867) needs four tokens (.4 + .3 + .15 = .85 < .867)
    assert set(top_p_draws(PROBS, top2 - 0.01, temperature=1.0).tolist()) == {0, 1, 3, 4}


def test_greedy_sample_next_is_argmax_and_ignores_generator():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 4.9, 0.0], [-2.0, -3.0, -1.5]])
    out = sample_next(logits, SamplingParams(temperature=0.0, top_p=0.5), None)
    assert out.tolist() == [1, 0, 2]


def chi_square(counts, probs):
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))


# chi-square critical value for 5 degrees of freedom at p = 1e-4
CHI2_DF5_1E4 = 25.74


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sampling_frequencies_match_softmax(temperature):
    logits = torch.tensor([1.0, -0.5, 0.3, 2.0, 0.0, -1.0])
    n = 20_000
    draws = sample_next(
        logits.expand(n, -1), SamplingParams(temperature=temperature), torch.Generator().manual_seed(11)
    )
    counts = torch.bincount(draws, minlength=6).tolist()
    target = torch.softmax(logits / temperature, -1).tolist()
    assert chi_square(counts, target) < CHI2_DF5_1E4
    # and the test has power: the untempered softmax is rejected when T != 1
    if temperature != 1.0:
        assert chi_square(counts, torch.softmax(logits, -1).tolist()) > 10 * CHI2_DF5_1E4


# ----------------------------------------------------------------------------- (e) seeds


def test_sample_next_same_seed_same_samples():
    logits = torch.randn(500, 20, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.9, top_p=0.9)
    a = sample_next(logits, params, torch.Generator().manual_seed(5))
    b = sample_next(logits, params, torch.Generator().manual_seed(5))
    c = sample_next(logits, params, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_generate_same_seed_same_generation(policy):
    model, tok = policy
    engine = HFEngine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.95)
    a = engine.generate(PROMPTS, 2, params, generator=torch.Generator().manual_seed(42))
    b = engine.generate(PROMPTS, 2, params, generator=torch.Generator().manual_seed(42))
    c = engine.generate(PROMPTS, 2, params, generator=torch.Generator().manual_seed(43))
    assert a.tokens == b.tokens and a.logprobs == b.logprobs and a.finished == b.finished
    assert a.tokens != c.tokens


# ----------------------------------------------------------------------------- (f) validation


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
        ({"temperature": -0.1}, "temperature must be >= 0, got -0.1"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_p": -0.2}, r"top_p must be in \(0, 1\], got -0.2"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_boundaries_accepted():
    p = SamplingParams(max_new_tokens=1, temperature=0.0, top_p=1.0)
    assert (p.max_new_tokens, p.temperature, p.top_p) == (1, 0.0, 1.0)


def test_generate_rejects_bad_requests(policy):
    model, tok = policy
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="need at least one prompt and n >= 1, got 1 prompts, n=0"):
        engine.generate([[1]], 0, params)
    with pytest.raises(ValueError, match="got 0 prompts"):
        engine.generate([], 1, params)
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        engine.generate([[1, 4], []], 1, params)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_budgets_equal_truncating_an_unbudgeted_run(policy, temperature):
    model, tok = policy
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12]]
    budgets = [3, 12, 1]
    params = SamplingParams(max_new_tokens=10, temperature=temperature)
    full = engine.generate(prompts, 4, params, generator=torch.Generator().manual_seed(7))
    cut = engine.generate(prompts, 4, params, generator=torch.Generator().manual_seed(7), budgets=budgets)
    for i, (toks, lps) in enumerate(zip(full.tokens, full.logprobs)):
        lim = min(10, budgets[full.prompt_index[i]])
        assert cut.tokens[i] == toks[:lim]
        assert cut.logprobs[i] == pytest.approx(lps[:lim], abs=1e-6)
        assert cut.finished[i] == (tok.eos_token_id in toks[:lim])
    assert max(len(t) for t in cut.tokens[8:]) <= 1  # the third prompt's budget of 1
    with pytest.raises(ValueError, match="budgets: need one budget >= 1 per prompt"):
        engine.generate(prompts, 1, params, budgets=[1, 2])


# ----------------------------------------------------------------------------- stop ids


@pytest.mark.parametrize("kind", ["hf", "static"])
def test_stop_ids_cut_the_same_draws_at_the_first_stop_token(policy, kind):
    """One draw per request per step whatever has stopped, so a generation with stop ids is the
    generation without them, cut after the first stop (or eos) token; a stopped row is not
    ``finished``, and its log-probs are the uncut ones."""
    from creditrl.policy.engines import make_engine

    model, tok = policy
    engine = make_engine(model, eos_id=STOP, pad_id=tok.pad_token_id, kind=kind)
    full = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(5))
    counts: dict[int, int] = {}
    for toks in full.tokens:
        for t in toks[:-1]:
            counts[t] = counts.get(t, 0) + 1
    stops = tuple(sorted(counts, key=lambda t: -counts[t])[:2])  # frequent, so most rows stop early
    params = SamplingParams(max_new_tokens=12, stop_ids=stops)
    cut = engine.generate(PROMPTS, 4, params, generator=torch.Generator().manual_seed(5))
    n_stopped = 0
    for f_t, f_l, f_done, c_t, c_l, c_done in zip(
        full.tokens, full.logprobs, full.finished, cut.tokens, cut.logprobs, cut.finished
    ):
        first = next((i for i, t in enumerate(f_t) if t in stops), None)
        if first is None:
            assert (c_t, c_l, c_done) == (f_t, f_l, f_done)
        else:
            n_stopped += 1
            assert c_t == f_t[: first + 1] and c_l == f_l[: first + 1]
            assert c_done is False and c_t[-1] in stops
    assert n_stopped >= 4  # the stop tokens were hit, so the comparison above was exercised


def test_stop_ids_are_validated():
    with pytest.raises(ValueError, match="stop_ids must be a tuple"):
        SamplingParams(stop_ids=[3])
    with pytest.raises(ValueError, match="stop_ids must be a tuple"):
        SamplingParams(stop_ids=(-1,))


# ----------------------------------------------------------------------------- chunked generation


@pytest.mark.parametrize("kind", ["hf", "static"])
@pytest.mark.parametrize("max_rows", [1, 5, 16])
def test_generate_chunked_samples_what_one_call_samples(policy, kind, max_rows):
    """Calls of at most ``max_rows`` rows draw the single call's uniforms for their rows, so the
    tokens are the single call's, log-probs agree to rounding, and the generator ends in the
    same state (the next draw is the same)."""
    from creditrl.policy.engines import generate_chunked, make_engine

    model, tok = policy
    engine = make_engine(model, eos_id=STOP, pad_id=tok.pad_token_id, kind=kind)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    g_one, g_chunked = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    one = engine.generate(PROMPTS, 4, params, generator=g_one, budgets=[10, 3, 10, 6])
    chunked = generate_chunked(
        engine, PROMPTS, 4, params, generator=g_chunked, budgets=[10, 3, 10, 6], max_rows=max_rows
    )
    assert chunked.tokens == one.tokens
    assert chunked.finished == one.finished and chunked.prompt_index == one.prompt_index
    assert chunked.prompt_ids == one.prompt_ids
    for a, b in zip(chunked.logprobs, one.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert len({len(t) for t in one.tokens}) > 2  # rows of several lengths (eos, budgets)
    assert torch.equal(torch.rand(3, generator=g_one), torch.rand(3, generator=g_chunked))


@pytest.mark.parametrize("max_positions", [1, 40, 90])
def test_generate_chunked_by_positions_samples_what_one_call_samples(policy, max_positions):
    """A bound on each call's padded cache (rows x (longest request + largest limit)) splits the
    rows into calls that respect it, and the tokens are still the single call's."""
    from creditrl.policy.engines import generate_chunked, make_engine
    from creditrl.policy.engines.base import _row_spans, expand_requests

    model, tok = policy
    engine = make_engine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    budgets = [10, 3, 10, 6]
    requests, limit = expand_requests(PROMPTS, 4, params, budgets)
    lengths, limits = [len(r) for r in requests], limit.tolist()
    spans = _row_spans(lengths, limits, 16, max_positions)
    assert [a for a, _ in spans] == [0] + [b for _, b in spans[:-1]] and spans[-1][1] == len(requests)
    for a, b in spans:
        assert b - a <= 16
        assert b - a == 1 or (b - a) * (max(lengths[a:b]) + max(limits[a:b])) <= max_positions
    assert len(spans) > 1  # the bound binds at every size tried
    g_one, g_chunked = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    one = engine.generate(PROMPTS, 4, params, generator=g_one, budgets=budgets)
    chunked = generate_chunked(
        engine, PROMPTS, 4, params, generator=g_chunked, budgets=budgets, max_rows=16, max_positions=max_positions
    )
    assert chunked.tokens == one.tokens and chunked.finished == one.finished
    assert torch.equal(torch.rand(3, generator=g_one), torch.rand(3, generator=g_chunked))


def test_generate_chunked_rejects_a_bad_bound(policy):
    from creditrl.policy.engines import generate_chunked

    model, tok = policy
    engine = HFEngine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    with pytest.raises(ValueError, match="max_rows must be >= 1, got 0"):
        generate_chunked(engine, PROMPTS, 2, SamplingParams(), max_rows=0)
    with pytest.raises(ValueError, match="max_positions must be >= 1 or None, got 0"):
        generate_chunked(engine, PROMPTS, 2, SamplingParams(), max_rows=4, max_positions=0)
