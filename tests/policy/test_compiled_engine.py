"""CompiledEngine against HF ``generate``, HFEngine and the tempered nucleus distribution.

The decode step is traced by dynamo in every test; most run it with dynamo's ``eager`` backend
(the same captured graph, run by torch: inductor's CPU compilation of the tiny model takes about
two minutes on two cores), and one test compiles it with inductor as the engine does by default.
Models and references are those of the static engine's tests (test_static_engine.py).
"""

import copy
import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

from creditrl.policy.engines import CompiledEngine, HFEngine, SamplingParams, choose_engine, make_engine, select
from creditrl.policy.engines import compiled as ce
from policy import test_static_engine
from policy.test_static_engine import (
    PAD,
    PROMPTS,
    STOP,
    VOCAB,
    expected_first_token_probs,
    full_logits,
    hf_greedy,
    max_abs_diff,
    peak,
    reference_logprobs,
    small_config,
)
from small_runs import TINY_RUN

# the static engine's models, shared: the trained tiny preset, peaked Qwen2/Qwen3 and a peaked tiny
trained_tiny, qwen2, qwen3 = test_static_engine.trained_tiny, test_static_engine.qwen2, test_static_engine.qwen3
peaked = test_static_engine.peaked


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    """Dynamo captures the step, torch runs it (see the module docstring)."""
    defaults = dict(CompiledEngine.__init__.__kwdefaults__)
    defaults["backend"] = "eager"
    monkeypatch.setattr(CompiledEngine.__init__, "__kwdefaults__", defaults)


def _case(request, name):
    if name == "tiny":
        model, tok, prompts = request.getfixturevalue("trained_tiny")
        return model, prompts, tok.eos_token_id, 8
    model, eos = request.getfixturevalue(name)
    return model, PROMPTS, eos, 16


def assert_matches_hf(engine, model, prompts, eos, max_new, *, n=1):
    """Greedy: HF ``generate``'s tokens and the HF engine's log-probs within 1e-5 (fp32)."""
    params = SamplingParams(max_new_tokens=max_new, temperature=0.0)
    ref = HFEngine(model, eos_id=eos, pad_id=PAD).generate(prompts, n, params)
    gen = engine.generate(prompts, n, params)
    assert gen.tokens == ref.tokens == [t for t in hf_greedy(model, prompts, max_new, eos) for _ in range(n)]
    assert gen.finished == ref.finished
    assert max(max_abs_diff(a, b) for a, b in zip(gen.logprobs, ref.logprobs)) < 1e-5


@pytest.mark.parametrize("name", ["tiny", "qwen2", "qwen3"])
def test_greedy_tokens_and_logprobs_equal_hf(request, name):
    model, prompts, eos, max_new = _case(request, name)
    expected = hf_greedy(model, prompts, max_new, eos)
    assert any(eos in t for t in expected) and not all(eos in t for t in expected)  # stopped and unstopped rows
    assert_matches_hf(CompiledEngine(model, eos_id=eos, pad_id=PAD), model, prompts, eos, max_new, n=2)


def test_mistral_within_window_equals_hf_and_beyond_window_is_refused():
    model = peak(MistralForCausalLM(small_config(MistralConfig, sliding_window=24)), 3)
    engine = CompiledEngine(model, eos_id=2, pad_id=PAD)
    assert_matches_hf(engine, model, PROMPTS, 2, 12)
    with pytest.raises(ValueError, match="sliding_window=24"):
        engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=20, temperature=0.0))


def test_bf16_holds_matrices_in_bf16_and_logprobs_stay_near_fp32(qwen2):
    """policy.precision=bf16: the products' weights and the cache in bf16 (norms, embeddings in float32);
    each returned log-prob within bf16 rounding of a float32 full forward over the same tokens."""
    model, eos = qwen2
    engine = CompiledEngine(model, eos_id=eos, pad_id=PAD, precision="bf16")
    gen = engine.generate(PROMPTS, 2, SamplingParams(12, 1.0), generator=torch.Generator().manual_seed(0))
    layer = engine.dec.layers[0]
    assert layer.qkv.dtype == layer.down.dtype == engine.dec.lm_head.dtype == torch.bfloat16
    assert layer.ln1.dtype == engine.dec.embed.dtype == torch.float32
    assert {b.cache.dtype for b in engine.buckets.values()} == {torch.bfloat16}
    rows = zip(gen.prompt_ids, gen.tokens, gen.logprobs)
    gaps = [max_abs_diff(lp, reference_logprobs(model, p, t)) for p, t, lp in rows]
    assert 1e-4 < max(gaps) < 0.25  # bf16 rounding: present, and small


def test_inductor_step_equals_hf_and_weight_updates_do_not_recompile(trained_tiny):
    """The default backend: inductor compiles the step once for the bucket; after the weights
    change in place (an optimizer step), the next decode is HF's on the new weights, compiled
    by nobody (dynamo's graph count unchanged)."""
    from torch._dynamo.utils import counters

    _, tok, prompts = trained_tiny
    model = copy.deepcopy(trained_tiny[0])
    engine = CompiledEngine(model, eos_id=tok.eos_token_id, pad_id=PAD, backend="inductor")
    assert_matches_hf(engine, model, prompts, tok.eos_token_id, 8)
    assert engine.backend == "inductor" and engine.compilations == 1
    graphs = counters["stats"]["unique_graphs"]
    before = HFEngine(model, eos_id=tok.eos_token_id, pad_id=PAD).generate(prompts, 1, SamplingParams(8, 0.0))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.3).add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    assert_matches_hf(engine, model, prompts, tok.eos_token_id, 8)
    after = engine.generate(prompts, 1, SamplingParams(8, 0.0))
    assert after.tokens != before.tokens  # the change is visible: the engine read the new weights
    assert engine.compilations == 1 and counters["stats"]["unique_graphs"] == graphs


def test_weight_sync_and_one_compilation_per_bucket(peaked):
    model = copy.deepcopy(peaked[0])
    engine = CompiledEngine(model, eos_id=STOP, pad_id=PAD)
    assert_matches_hf(engine, model, PROMPTS, STOP, 10)  # 5 rows -> 8, 7 + 9 columns -> 64
    assert_matches_hf(engine, model, PROMPTS[:3], STOP, 10)  # 3 rows -> 4: a second bucket
    assert_matches_hf(engine, model, PROMPTS[1:], STOP, 12)  # 4 rows, 18 columns: the same bucket
    assert sorted(engine.buckets) == [(4, 64), (8, 64)] and engine.compilations == 2
    before = engine.generate(PROMPTS, 1, SamplingParams(10, 0.0)).tokens
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # in place, as an optimizer step
    assert_matches_hf(engine, model, PROMPTS, STOP, 10)
    assert engine.generate(PROMPTS, 1, SamplingParams(10, 0.0)).tokens != before
    assert_matches_hf(engine, model, PROMPTS[:3], STOP, 10)
    assert engine.compilations == 2


def test_a_failing_inductor_falls_back_to_eager_and_says_so(peaked, monkeypatch):
    """Where inductor cannot build the step (here: a stand-in that raises, as a missing C++ compiler
    does), the engine decodes eagerly, the same tokens, and its log line says why."""
    import logging

    def broken(fn, **kwargs):
        def call(*args):
            raise RuntimeError("InductorError: no working C++ compiler found")

        return call

    model, _ = peaked
    monkeypatch.setattr(ce.torch, "compile", broken)
    engine = CompiledEngine(model, eos_id=STOP, pad_id=PAD, backend="inductor")
    logger, lines = logging.getLogger("creditrl"), []
    handler, level = logging.Handler(), logger.level
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert_matches_hf(engine, model, PROMPTS, STOP, 10)
        assert_matches_hf(engine, model, PROMPTS[:2], STOP, 10)  # a second bucket: eager from the start
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    why = "eager (inductor failed: RuntimeError: InductorError: no working C++ compiler found)"
    assert engine.backend == why and engine.compilations == 2
    assert lines[0].startswith("compiled engine: decode step for 8 rows x 64 columns in ")
    assert lines[0].endswith(f" s ({why})") and len(lines) == 2


@pytest.mark.parametrize("name", ["tiny", "qwen2", "qwen3"])
def test_sync_copies_every_live_weight_into_the_fused_tensors(request, name):
    """After an in-place change of every parameter, sync leaves each engine tensor equal to a freshly
    fused decoder's (q|k|v and gate|up parts, biases, q/k norms, head): in place, at the same address."""
    from creditrl.policy.engines.decoder import Decoder

    model = copy.deepcopy(_case(request, name)[0])
    engine = CompiledEngine(model, eos_id=STOP, pad_id=PAD)
    engine.sync()
    addresses = [t.data_ptr() for t in ce._tensors(engine.dec)]
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    engine.sync()
    mine, fresh = ce._tensors(engine.dec), ce._tensors(Decoder(model))
    assert len(mine) == len(fresh) == len(addresses)
    assert all(torch.equal(a, b) for a, b in zip(mine, fresh))
    assert [t.data_ptr() for t in mine] == addresses


def test_bucket_sizes():
    assert [ce.bucket(n) for n in (1, 2, 3, 5, 8, 9, 100)] == [1, 2, 4, 8, 8, 16, 128]
    assert [ce.bucket(n, ce.MIN_COLUMNS) for n in (1, 64, 65, 1000)] == [64, 64, 128, 1024]


@pytest.mark.parametrize("name", ["peaked", "qwen3"])
def test_sampled_tokens_match_hf_engine_for_the_same_seed(request, name):
    model, eos = request.getfixturevalue(name)
    eos = STOP if name == "peaked" else eos
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.9, stop_ids=(5,))
    seeded = {"generator": torch.Generator().manual_seed(4)}
    ref = HFEngine(model, eos_id=eos, pad_id=PAD).generate(PROMPTS, 3, params, **seeded)
    seeded = {"generator": torch.Generator().manual_seed(4)}
    gen = CompiledEngine(model, eos_id=eos, pad_id=PAD).generate(PROMPTS, 3, params, **seeded)
    assert gen.tokens == ref.tokens and gen.finished == ref.finished
    assert len({len(t) for t in gen.tokens}) >= 2  # rows end at different steps
    assert max(max_abs_diff(a, b) for a, b in zip(gen.logprobs, ref.logprobs)) < 1e-5


def test_chunked_calls_sample_what_one_call_samples(peaked):
    """``generate_chunked`` (MC continuations, Ray workers: ``draw_rows``) through the compiled engine:
    the chunks' tokens are the single call's, and the generator ends where the single call leaves it."""
    from creditrl.policy.engines import generate_chunked

    model, _ = peaked
    engine = CompiledEngine(model, eos_id=STOP, pad_id=PAD)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    one_gen, chunk_gen = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    one = engine.generate(PROMPTS, 3, params, generator=one_gen)
    chunked = generate_chunked(engine, PROMPTS, 3, params, generator=chunk_gen, max_rows=4)
    assert chunked.tokens == one.tokens and chunked.finished == one.finished
    assert len({tuple(t) for t in one.tokens}) > len(PROMPTS)  # samples of a prompt differ
    assert torch.equal(one_gen.get_state(), chunk_gen.get_state())
    assert sorted(engine.buckets) == [(4, 64), (16, 64)]


@pytest.mark.parametrize("temperature, top_p", [(0.5, 1.0), (1.0, 0.6)])
def test_first_token_frequencies_match_tempered_nucleus_distribution(peaked, temperature, top_p):
    model, _ = peaked
    prompt, n = [1, 14, 15, 16], 4000
    gen = CompiledEngine(model, eos_id=STOP, pad_id=PAD).generate(
        [prompt], n, SamplingParams(1, temperature, top_p), generator=torch.Generator().manual_seed(5)
    )
    draws = torch.tensor([t[0] for t in gen.tokens])
    freq = torch.bincount(draws, minlength=VOCAB + 3).double()[: full_logits(model, prompt).shape[-1]] / n
    target, kept = expected_first_token_probs(model, prompt, temperature, top_p)
    assert 0.5 * float((freq - target).abs().sum()) < 0.05
    assert float(freq[~kept].sum()) == 0.0
    raw = torch.softmax(full_logits(model, prompt)[-1].double(), -1)
    assert 0.5 * float((freq - raw).abs().sum()) > 0.15  # the test has power
    lp = torch.tensor([row[0] for row in gen.logprobs], dtype=torch.double)
    assert float((lp - raw.log()[draws]).abs().max()) < 1e-5  # raw (untempered) log-probs


def test_auto_picks_compiled_on_cuda_only(peaked, monkeypatch):
    model, _ = peaked
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2))
    assert choose_engine(model, "auto")[0] == "static"  # the CPU keeps its engine
    monkeypatch.setattr(select, "module_device", lambda m: torch.device("cuda"))
    assert choose_engine(model, "auto") == ("compiled", "auto: the compiled engine runs llama on CUDA")
    kind, why = choose_engine(gpt2, "auto")
    assert kind == "hf" and why.startswith("auto: the compiled engine cannot run this model: model_type 'gpt2'")
    monkeypatch.undo()
    assert isinstance(make_engine(model, eos_id=STOP, pad_id=PAD, kind="compiled"), CompiledEngine)
    with pytest.raises(ValueError, match="CompiledEngine cannot run this model: model_type 'gpt2'"):
        make_engine(gpt2, eos_id=STOP, pad_id=PAD, kind="compiled")
    with pytest.raises(ValueError, match="backend: expected one of"):
        CompiledEngine(model, eos_id=STOP, pad_id=PAD, backend="cudagraphs")


def test_creditrl_train_three_iterations(tmp_path, monkeypatch, capsys):
    from creditrl.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["train", "--run-dir", "run"]
    for item in [*TINY_RUN, "policy.engine=compiled", "train.iterations=3"]:
        argv += ["--set", item]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss/total" in r]
    assert [r["iteration"] for r in trained] == [1, 2, 3]
    assert all(r["tokens/generated"] > 0 for r in trained)
    # the update's own forward gives the log-probs the engine returned: approx KL to rounding
    assert all(abs(r["policy/approx_kl"]) < 1e-6 for r in trained)
    err = capsys.readouterr().err
    assert "creditrl: engine compiled (as configured)" in err
    # rollouts (4 prompts x 4 samples) and the evaluations (4 problems) share one engine: one compilation each
    assert err.count("compiled engine: decode step for 16 rows x 64 columns") == 1
    assert err.count("compiled engine: decode step for 4 rows x 64 columns") == 1


def test_config_refuses_lora_with_the_compiled_engine():
    from creditrl.config import ConfigError, load_config
    from creditrl.train.resolve import checked

    with pytest.raises(ConfigError, match="'compiled' reads plain weights and cannot run LoRA adapters; use auto"):
        checked(load_config(overrides=["policy.lora_r=4", "policy.engine=compiled"]))
    assert checked(load_config(overrides=["policy.engine=compiled"])).policy.engine == "compiled"
