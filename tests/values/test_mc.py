"""Monte-Carlo values (VinePPO): exact values with a scripted engine, dedup, budgets, masks, and
the real HFEngine against slow references."""

import pytest
import torch

from creditrl.policy.engines import Generation, HFEngine, SamplingParams
from creditrl.policy.tokenizer import decode_response
from creditrl.rollout.batch import batch_from_generation
from creditrl.values import MCValues, mc_values
from creditrl.values.mc import step_spans

PAD = 0


class ScriptedEngine:
    """Returns the continuations ``script[tuple(prefix)]`` (one per sample) for each requested
    prefix, and records every call."""

    def __init__(self, script):
        self.script = script
        self.calls = []

    def generate(self, prompts, n, params, *, generator=None, budgets=None):
        prompts = [list(p) for p in prompts]
        self.calls.append((prompts, n, params))
        tokens = []
        for p in prompts:
            conts = self.script[tuple(p)]
            tokens += [list(conts[j % len(conts)]) for j in range(n)]
        return Generation(
            prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
            prompt_ids=[p for p in prompts for _ in range(n)],
            tokens=tokens,
            logprobs=[[0.0] * len(t) for t in tokens],
            finished=[False] * len(tokens),
        )


def make_batch(prompts, responses, ends):
    """A TrajectoryBatch of the given prompts and responses; ``ends[b]`` = step-end indices."""
    gen = Generation(
        prompt_index=list(range(len(prompts))),
        prompt_ids=[list(p) for p in prompts],
        tokens=[list(r) for r in responses],
        logprobs=[[0.0] * len(r) for r in responses],
        finished=[False] * len(responses),
    )
    batch = batch_from_generation(gen, list(range(len(prompts))), PAD)
    step_ends = torch.zeros(batch.response_ids.shape, dtype=torch.bool)
    for b, row in enumerate(ends):
        step_ends[b, row] = True
    return batch, step_ends


def decode(ids):
    return ",".join(str(i) for i in ids)


class ContainsFive:
    """outcome 1.0 when token 5 occurs in the completion; records every (row, completion)."""

    def __init__(self):
        self.calls = []

    def __call__(self, b, text):
        self.calls.append((b, text))
        return 1.0 if "5" in text.split(",") else 0.0


P0, P1 = [1, 2], [1, 3, 3]


def shared_prefix_case():
    # row 0 and row 1 share the prompt P0 and their first step [10, 11]; rows 2 and 3 share P1
    prompts = [P0, P0, P1, P1]
    responses = [[10, 11, 12, 13, 2], [10, 11, 14], [20], [21, 22, 23]]
    # row 3 marks only its first step end (the last token closes the final step anyway); row 2
    # has a stray mark on padding, which must be ignored
    ends = [[1, 4], [1, 2], [0, 3], [0]]
    script = {
        tuple(P0): [[5, 2], [6, 2]],  # V = 1/2
        tuple(P0 + [10, 11]): [[5], [5, 6]],  # V = 1
        tuple(P1): [[5], [5]],  # V = 1
        tuple(P1 + [21]): [[5], [6]],  # V = 1/2
    }
    return prompts, responses, ends, script


def test_exact_values_shared_states_and_requests():
    prompts, responses, ends, script = shared_prefix_case()
    batch, step_ends = make_batch(prompts, responses, ends)
    engine, outcome = ScriptedEngine(script), ContainsFive()
    params = SamplingParams(max_new_tokens=10)
    out = mc_values(
        engine, batch, step_ends, outcome, samples=2, params=params, generator=torch.Generator(), decode=decode
    )
    assert isinstance(out, MCValues)
    assert out.values.dtype == torch.float32
    assert out.values.tolist() == [
        [0.5, 0.5, 1.0, 1.0, 1.0],
        [0.5, 0.5, 1.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, 0.5, 0.5, 0.0, 0.0],
    ]
    # one call, each distinct state requested exactly once, with the caller's params
    assert len(engine.calls) == 1
    requested, n, used = engine.calls[0]
    assert sorted(requested) == sorted([P0, P0 + [10, 11], P1, P1 + [21]])
    assert (n, used) == (2, params)
    assert (out.n_states, out.n_continuations, out.n_tokens) == (4, 8, 2 + 2 + 1 + 2 + 1 + 1 + 1 + 1)
    # completions are response prefix + continuation (no prompt), judged by the first row that
    # reached the state
    assert sorted(outcome.calls) == sorted(
        [(0, "5,2"), (0, "6,2"), (0, "10,11,5"), (0, "10,11,5,6"), (2, "5"), (2, "5"), (3, "21,5"), (3, "21,6")]
    )


def test_values_match_a_slow_per_row_reference():
    prompts, responses, ends, script = shared_prefix_case()
    batch, step_ends = make_batch(prompts, responses, ends)
    out = mc_values(
        ScriptedEngine(script),
        batch,
        step_ends,
        ContainsFive(),
        samples=2,
        params=SamplingParams(max_new_tokens=10),
        generator=None,
        decode=decode,
    )
    for b, (prompt, response) in enumerate(zip(prompts, responses)):
        cuts = sorted({e for e in ends[b] if e < len(response)} | {len(response) - 1})
        start = 0
        for end in cuts:
            conts = script[tuple(prompt + response[:start])]
            v = sum("5" in decode(response[:start] + c).split(",") for c in conts) / len(conts)
            assert out.values[b, start : end + 1].tolist() == [v] * (end + 1 - start)
            start = end + 1


def test_budget_truncates_continuations_and_skips_exhausted_prefixes():
    # max_new_tokens = 4. Row 0: states after 0, 1 and 3 response tokens have budgets 4, 3, 1.
    # Row 1: the state after 4 tokens has no budget left: its value is the outcome of the
    # prefix itself, and it is never sent to the engine.
    prompts = [[1], [1, 4]]
    responses = [[10, 11, 12, 13], [10, 5, 12, 13, 14]]
    ends = [[0, 2], [3]]
    long = [[7, 7, 5, 9]]  # token 5 survives a budget of 3 or more, not of 1
    script = {(1,): long, (1, 10): long, (1, 10, 11, 12): long, (1, 4): [[7]]}
    batch, step_ends = make_batch(prompts, responses, ends)
    engine, outcome = ScriptedEngine(script), ContainsFive()
    out = mc_values(
        engine,
        batch,
        step_ends,
        outcome,
        samples=3,
        params=SamplingParams(max_new_tokens=4),
        generator=None,
        decode=decode,
    )
    assert out.values.tolist() == [[1.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]]
    assert sorted(engine.calls[0][0]) == sorted([[1], [1, 10], [1, 10, 11, 12], [1, 4]])
    assert sorted(set(outcome.calls)) == sorted(
        [(0, "7,7,5,9"), (0, "10,7,7,5"), (0, "10,11,12,7"), (1, "7"), (1, "10,5,12,13")]
    )
    assert outcome.calls.count((1, "10,5,12,13")) == 1  # not sampled: judged once
    assert (out.n_states, out.n_continuations, out.n_tokens) == (5, 12, 3 * (4 + 4 + 4 + 1))


def test_masked_tokens_get_zero_and_do_not_change_other_values():
    prompts, responses, ends, script = shared_prefix_case()
    batch, step_ends = make_batch(prompts, responses, ends)
    kwargs = dict(samples=2, params=SamplingParams(max_new_tokens=10), generator=None, decode=decode)
    full = mc_values(ScriptedEngine(script), batch, step_ends, ContainsFive(), **kwargs).values
    assert (full[~batch.response_mask] == 0).all()  # padding
    holes = batch.response_mask.clone()
    holes[0, 1] = holes[0, 3] = holes[3, 2] = False  # e.g. tool-output tokens inside responses
    batch.response_mask = holes
    out = mc_values(ScriptedEngine(script), batch, step_ends, ContainsFive(), **kwargs).values
    assert (out[~holes] == 0).all()
    assert torch.equal(out[holes], full[holes])


def test_empty_responses_have_no_states():
    # an empty response has no steps: nothing is requested for it and its row is all zeros
    batch, step_ends = make_batch([[1], [1, 2]], [[], [10]], [[], [0]])
    engine = ScriptedEngine({(1, 2): [[5]]})
    out = mc_values(
        engine,
        batch,
        step_ends,
        ContainsFive(),
        samples=1,
        params=SamplingParams(max_new_tokens=3),
        generator=None,
        decode=decode,
    )
    assert out.values.tolist() == [[0.0], [1.0]]
    assert engine.calls[0][0] == [[1, 2]]
    # no states at all: the engine is not called
    batch, step_ends = make_batch([[1], [1]], [[], []], [[], []])
    engine = ScriptedEngine({})
    out = mc_values(
        engine,
        batch,
        step_ends,
        ContainsFive(),
        samples=4,
        params=SamplingParams(max_new_tokens=1),
        generator=None,
        decode=decode,
    )
    assert engine.calls == []
    assert (out.n_states, out.n_continuations, out.n_tokens) == (0, 0, 0)
    assert out.values.tolist() == [[0.0], [0.0]]


def test_step_spans_tile_the_response():
    assert step_spans([False, True, False, False], 4) == [(0, 2), (2, 4)]
    assert step_spans([True, False, True, True], 3) == [(0, 1), (1, 3)]  # mark at t=3 >= length
    assert step_spans([False] * 3, 0) == []
    assert step_spans([True, True], 2) == [(0, 1), (1, 2)]


def test_input_validation():
    prompts, responses, ends, script = shared_prefix_case()
    batch, step_ends = make_batch(prompts, responses, ends)
    kwargs = dict(params=SamplingParams(max_new_tokens=10), generator=None, decode=decode)
    with pytest.raises(ValueError, match=r"step_ends must be a bool tensor of shape \(B, T\) = \(4, 5\)"):
        mc_values(ScriptedEngine(script), batch, step_ends.long(), ContainsFive(), samples=2, **kwargs)
    with pytest.raises(ValueError, match=r"got dtype torch.bool, shape \(4, 4\)"):
        mc_values(ScriptedEngine(script), batch, step_ends[:, :4], ContainsFive(), samples=2, **kwargs)
    with pytest.raises(ValueError, match="samples must be >= 1, got 0"):
        mc_values(ScriptedEngine(script), batch, step_ends, ContainsFive(), samples=0, **kwargs)


# ----------------------------------------------------------------------------- real HFEngine

STOP = 57  # a token the fixture policy emits often: the eos, for mixed response lengths
PROMPTS = [[1, 5, 6], [1], [1, 20, 30, 40, 50, 60, 70]]


@pytest.fixture(scope="module")
def policy(peaked_tiny):
    return peaked_tiny(0, 123)


class Recording:
    """Wraps an engine and keeps every Generation it returns."""

    def __init__(self, engine):
        self.engine = engine
        self.generations = []

    def generate(self, prompts, n, params, *, generator=None, budgets=None):
        gen = self.engine.generate(prompts, n, params, generator=generator)
        self.generations.append(gen)
        return gen


def hf_case(policy, rollout_seed):
    """A sampled rollout (3 prompts x 3) with steps ending on ids divisible by 3."""
    model, tok = policy
    engine = HFEngine(model, eos_id=STOP, pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=10)
    gen = engine.generate(PROMPTS, 3, params, generator=torch.Generator().manual_seed(rollout_seed))
    batch = batch_from_generation(gen, gen.prompt_index, tok.pad_token_id)
    step_ends = (batch.response_ids % 3 == 0) & batch.response_mask
    return engine, batch, step_ends, params, tok


def even_length(b, text):
    """outcome 1.0 when the decoded completion has an even number of characters."""
    return float(len(text) % 2 == 0)


def rows_states(batch, step_ends):
    """Per row, per step: (prompt, response prefix, start, end) by a direct loop."""
    out = []
    for b in range(batch.size):
        prompt = batch.prompt_ids[b][batch.prompt_mask[b].bool()].tolist()
        length = int(batch.response_lengths[b])
        response = batch.response_ids[b, :length].tolist()
        start = 0
        for t in range(length):
            if bool(step_ends[b, t]) or t == length - 1:
                out.append((b, prompt, response[:start], start, t + 1))
                start = t + 1
    return out


def test_hf_greedy_values_equal_one_prefix_at_a_time_reference(policy):
    engine, batch, step_ends, _, tok = hf_case(policy, 0)
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    outcome = even_length
    dec = lambda ids: decode_response(tok, ids)  # noqa: E731
    out = mc_values(engine, batch, step_ends, outcome, samples=2, params=params, generator=None, decode=dec)
    states = rows_states(batch, step_ends)
    assert len(states) > batch.size  # some responses have several steps
    for b, prompt, prefix, start, end in states:
        if len(prefix) >= params.max_new_tokens:
            expected = outcome(b, dec(prefix))
        else:
            conts = engine.generate([prompt + prefix], 2, params).tokens
            expected = sum(outcome(b, dec(prefix + c[: params.max_new_tokens - len(prefix)])) for c in conts) / 2
        assert out.values[b, start:end].tolist() == [expected] * (end - start)
    assert (out.values[~batch.response_mask] == 0).all()


def test_hf_sampled_values_are_means_of_recorded_continuations(policy):
    engine, batch, step_ends, params, tok = hf_case(policy, 1)
    recording = Recording(engine)
    outcome = even_length
    dec = lambda ids: decode_response(tok, ids)  # noqa: E731
    samples = 4
    out = mc_values(
        recording,
        batch,
        step_ends,
        outcome,
        samples=samples,
        params=params,
        generator=torch.Generator().manual_seed(5),
        decode=dec,
    )
    assert len(recording.generations) == 1
    gen = recording.generations[0]
    states = rows_states(batch, step_ends)
    distinct = {(tuple(p), tuple(x)) for _, p, x, _, _ in states}
    # every distinct state requested once with `samples` continuations, and nothing else
    requested = [tuple(p) for p in gen.prompt_ids]
    assert sorted(set(requested)) == sorted({p + x for p, x in distinct})
    assert all(requested.count(r) == samples for r in set(requested))
    assert out.n_states == len(distinct) < len(states)  # s_0 is shared within each group
    assert out.n_continuations == len(gen.tokens) == samples * len(distinct)
    assert out.n_tokens == sum(len(t) for t in gen.tokens)
    for b, prompt, prefix, start, end in states:
        conts = [t for p, t in zip(gen.prompt_ids, gen.tokens) if p == prompt + prefix]
        budget = params.max_new_tokens - len(prefix)
        expected = sum(outcome(b, dec(prefix + c[:budget])) for c in conts) / samples
        assert out.values[b, start:end].tolist() == [expected] * (end - start)
    valid = out.values[batch.response_mask]
    assert ((valid >= 0) & (valid <= 1)).all()
    assert ((valid > 0) & (valid < 1)).any()  # the check has power: values are not all 0/1
    assert (out.values[~batch.response_mask] == 0).all()
    # same seed, same values
    again = mc_values(
        engine,
        batch,
        step_ends,
        outcome,
        samples=samples,
        params=params,
        generator=torch.Generator().manual_seed(5),
        decode=dec,
    )
    assert torch.equal(again.values, out.values)


def test_bounded_calls_give_the_one_calls_values_within_the_bound(policy):
    """``max_positions`` and ``max_rows`` split the continuations into engine calls within the
    bound (rows x (longest request + largest budget)) whose values are the single call's."""
    engine, batch, step_ends, params, tok = hf_case(policy, 1)
    dec = lambda ids: decode_response(tok, ids)  # noqa: E731

    def run(target, **bounds):
        return mc_values(
            target,
            batch,
            step_ends,
            even_length,
            samples=4,
            params=params,
            generator=torch.Generator().manual_seed(5),
            decode=dec,
            **bounds,
        )

    whole = run(engine)
    for bounds in ({"max_positions": 60}, {"max_rows": 5}, {"max_rows": 3, "max_positions": 200}):
        calls = []

        class Spy:
            def generate(self, prompts, n, params, **kwargs):
                limit = kwargs.get("budgets") or [params.max_new_tokens] * len(prompts)
                calls.append((len(prompts) * n, max(map(len, prompts)) + max(limit)))
                return engine.generate(prompts, n, params, **kwargs)

        out = run(Spy(), **bounds)
        assert torch.equal(out.values, whole.values) and out.n_tokens == whole.n_tokens, bounds
        assert len(calls) > 1 and sum(r for r, _ in calls) == whole.n_continuations
        assert all(r <= bounds.get("max_rows", r) for r, _ in calls)
        assert all(r * width <= bounds.get("max_positions", r * width) or r == 1 for r, width in calls)
