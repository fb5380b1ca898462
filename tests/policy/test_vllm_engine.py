"""``policy.engine=vllm`` on a machine without vLLM or a GPU.

These tests check the **adapter** (:mod:`creditrl.policy.engines.vllm`), not vLLM: a test double
of the small vLLM API surface the adapter uses (``vllm.LLM``, ``vllm.SamplingParams``, the
``RequestOutput``/``CompletionOutput``/``Logprob`` shapes) is put in ``sys.modules`` as
``vllm``. Its ``LLM`` loads the saved HF model and answers ``generate`` by running that real
model token by token (full forward, no cache): greedy at temperature 0, else a seeded draw,
stopping like vLLM does (``stop_token_ids`` kept, ``ignore_eos``, ``max_tokens``), with the raw
log-softmax of each sampled token in ``{token_id: Logprob}`` dicts that also hold the top-1
token (so the adapter must look the sampled id up). Its ``collective_rpc`` runs the adapter's
real worker-extension method on a fake worker whose ``model_runner.model.load_weights`` records
what it got and copies it into the double's model. What vLLM itself does on a GPU is checked by
``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM

from creditrl.config import ConfigError, load_config
from creditrl.policy.engines import ENGINES, HFEngine, SamplingParams, make_engine
from creditrl.policy.engines import vllm as vllm_engine
from creditrl.policy.engines.vllm import VLLMEngine, VLLMUnavailableError
from creditrl.train.resolve import checked

HINT = (
    "policy.engine=vllm needs vLLM and a CUDA GPU: pip install 'creditrl[vllm]' (without the constraints file; "
    "vllm 0.33 brings torch 2.14 and transformers < 5.21, inside creditrl's ranges) on the GPU machine"
)
PROMPTS = [[1, 5, 6], [1], [1, 20, 30, 40, 50, 60, 70], [1, 14, 15, 16]]


# ----------------------------------------------------------------------------- the double


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool


class FakeSamplingParams:
    """Accepts only fields of the real ``vllm.SamplingParams`` (as keywords) and applies its
    checks that matter here (greedy needs n == 1, temperature in [0, 2])."""

    FIELDS = {
        "n": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "seed": None,
        "stop": None,
        "stop_token_ids": None,
        "ignore_eos": False,
        "max_tokens": 16,
        "min_tokens": 0,
        "logprobs": None,
        "prompt_logprobs": None,
        "detokenize": True,
        "skip_special_tokens": True,
        "flat_logprobs": False,
    }

    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"unexpected SamplingParams fields {sorted(unknown)}")
        for k, v in {**self.FIELDS, **kwargs}.items():
            setattr(self, k, v)
        if self.temperature == 0 and self.n > 1:
            raise ValueError(f"n must be 1 when using greedy sampling, got {self.n}.")
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))


class FakeWorker:
    """What a worker extension method sees as ``self``: ``model_runner.model.load_weights``."""

    def __init__(self, llm):
        loads = llm.loads

        class Model:
            def load_weights(self, weights):
                weights = list(weights)
                loads.append({name: tuple(t.shape) for name, t in weights})
                state = llm.hf.state_dict()
                with torch.no_grad():
                    for name, t in weights:
                        state[name].copy_(t)
                return {name for name, _ in weights}

        self.model_runner = types.SimpleNamespace(model=Model())


class FakeLLM:
    instances: list = []
    ARGS = {
        "dtype",
        "gpu_memory_utilization",
        "enable_prefix_caching",
        "enforce_eager",
        "seed",
        "skip_tokenizer_init",
        "logprobs_mode",
        "worker_extension_cls",
        "max_model_len",
        "tensor_parallel_size",
    }

    def __init__(self, model: str, **kwargs):
        unknown = set(kwargs) - self.ARGS
        if unknown:
            raise TypeError(f"unexpected LLM arguments {sorted(unknown)}")
        self.model_path, self.kwargs = model, kwargs
        self.hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, kwargs["dtype"])).eval()
        self.eos = self.hf.config.eos_token_id
        self.calls: list[tuple[list[list[int]], list[FakeSamplingParams]]] = []
        self.loads: list[dict[str, tuple[int, ...]]] = []
        self.rpcs: list[tuple[str, tuple]] = []
        self.prefix_resets = 0
        self.reverse_outputs = False  # misbehave: answer in reverse order
        FakeLLM.instances.append(self)

    @torch.no_grad()
    def _complete(self, ids: list[int], sp: FakeSamplingParams) -> CompletionOutput:
        gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
        out, lps, reason, stop_reason = [], [], "length", None
        while len(out) < sp.max_tokens:
            logits = self.hf(torch.tensor([ids + out])).logits[0, -1].float()
            logp = torch.log_softmax(logits, -1)
            if sp.temperature == 0:
                tok = int(logits.argmax())
            else:
                probs = torch.softmax(logits / sp.temperature, -1)
                if sp.top_p < 1:
                    sp_, order = probs.sort(descending=True)
                    sp_[sp_.cumsum(-1) - sp_ >= sp.top_p] = 0
                    probs = torch.zeros_like(probs).scatter(-1, order, sp_)
                tok = int(torch.multinomial(probs, 1, generator=gen))
            top = int(logits.argmax())
            out.append(tok)
            lps.append({top: Logprob(float(logp[top]), 1), tok: Logprob(float(logp[tok]), 2)})
            if not sp.ignore_eos and tok == self.eos:
                reason = "stop"
                break
            if tok in sp.stop_token_ids:
                reason, stop_reason = "stop", tok
                break
        return CompletionOutput(0, "", out, None, lps if sp.logprobs is not None else None, reason, stop_reason)

    def generate(
        self,
        prompts,
        sampling_params=None,
        *,
        use_tqdm=True,
        lora_request=None,
        priority=None,
        tokenization_kwargs=None,
    ):
        if not isinstance(sampling_params, list) or len(sampling_params) != len(prompts):
            raise ValueError("one SamplingParams per prompt expected")
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        self.calls.append((ids, sampling_params))
        outs = [
            RequestOutput(str(i), None, p, None, [self._complete(p, sp)], True)
            for i, (p, sp) in enumerate(zip(ids, sampling_params))
        ]
        return outs[::-1] if self.reverse_outputs else outs

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs.append((method, args))
        module, name = self.kwargs["worker_extension_cls"].rsplit(".", 1)
        ext = getattr(importlib.import_module(module), name)
        return [getattr(ext, method)(FakeWorker(self), *args, **(kwargs or {}))]

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.prefix_resets += 1
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    """The double as ``vllm``, CUDA reported available, shared vLLM instances forgotten."""
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    FakeLLM.instances = []
    vllm_engine.reset_shared()
    yield module
    vllm_engine.reset_shared()


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    vllm_engine.reset_shared()


@pytest.fixture
def policy(peaked_tiny):
    model, tok = peaked_tiny(0, 123)
    return model, tok


def pick_enders(model, pad_id):
    """An eos and a stop id that greedy continuations of PROMPTS actually emit (at different
    places), so one test sees eos, stop tokens and budget cuts."""
    ref = HFEngine(model, eos_id=pad_id, pad_id=pad_id).generate(
        PROMPTS, 1, SamplingParams(max_new_tokens=12, temperature=0)
    )
    eos = next(t for t in ref.tokens[0] if t != ref.tokens[0][0])
    stop = next(t for t in ref.tokens[1] if t not in (ref.tokens[1][0], eos))
    return eos, stop


# ----------------------------------------------------------------------------- unavailable


def test_make_engine_without_vllm_raises_install_hint(no_vllm, policy):
    model, tok = policy
    assert "vllm" in ENGINES
    with pytest.raises(VLLMUnavailableError) as err:
        make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    assert str(err.value) == f"{HINT} (vllm is not installed)"


def test_make_engine_without_cuda_raises_install_hint(fake_vllm, monkeypatch, policy):
    model, tok = policy
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(VLLMUnavailableError, match=r"\(no CUDA device: torch.cuda.is_available\(\) is False\)$"):
        make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    assert FakeLLM.instances == []


def test_config_refuses_vllm_without_vllm_lora_or_ray(no_vllm):
    with pytest.raises(ConfigError) as err:
        checked(load_config(overrides=["policy.engine=vllm"]))
    assert str(err.value) == f"{HINT} (vllm is not installed)"
    with pytest.raises(ConfigError, match="does not run LoRA adapters; use policy.lora_r=0"):
        checked(load_config(overrides=["policy.engine=vllm", "policy.lora_r=4"]))
    with pytest.raises(ConfigError, match="use backend.name=local, got 'ray'"):
        checked(load_config(overrides=["policy.engine=vllm", "backend.name=ray"]))
    assert load_config(overrides=["policy.engine=hf"]).policy.engine == "hf"


def test_config_accepts_vllm_where_available(fake_vllm):
    assert load_config(overrides=["policy.engine=vllm"]).policy.engine == "vllm"


# ----------------------------------------------------------------------------- translation


def test_greedy_matches_hf_engine_with_budgets_and_stop_ids(fake_vllm, policy):
    model, tok = policy
    pad = tok.pad_token_id
    eos, stop = pick_enders(model, pad)
    params = SamplingParams(max_new_tokens=9, temperature=0.0, stop_ids=(stop,))
    budgets = [9, 4, 5, 9]
    engine = make_engine(model, eos_id=eos, pad_id=pad, kind="vllm")
    assert isinstance(engine, VLLMEngine)
    gen = engine.generate(PROMPTS, 2, params, budgets=budgets)
    ref = HFEngine(model, eos_id=eos, pad_id=pad).generate(PROMPTS, 2, params, budgets=budgets)

    assert gen.prompt_index == ref.prompt_index == [0, 0, 1, 1, 2, 2, 3, 3]
    assert gen.prompt_ids == ref.prompt_ids
    assert gen.tokens == ref.tokens
    assert gen.finished == ref.finished
    for a, b in zip(gen.logprobs, ref.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    # the cases the contract distinguishes all occur: eos (finished), a kept stop token
    # (not finished), a budget cut, and max_new_tokens
    limits = [9, 9, 4, 4, 5, 5, 9, 9]
    ends = [(t[-1], f, len(t), lim) for t, f, lim in zip(gen.tokens, gen.finished, limits)]
    assert any(last == eos and fin for last, fin, _, _ in ends)
    assert any(last == stop and not fin for last, fin, _, _ in ends)
    assert any(n == lim < 9 and last not in (eos, stop) and not fin for last, fin, n, lim in ends)
    assert any(n == 9 and not fin for _, fin, n, _ in ends)
    # the requests vLLM got: one per sample, prompt-major, n=1, budgets as max_tokens
    llm = FakeLLM.instances[0]
    ((ids, sps),) = llm.calls
    assert ids == [list(p) for p in PROMPTS for _ in range(2)]
    assert [sp.max_tokens for sp in sps] == limits
    for sp in sps:
        assert (sp.n, sp.temperature, sp.top_p, sp.seed, sp.logprobs) == (1, 0.0, 1.0, None, 0)
        assert sp.stop_token_ids == [eos, stop] and sp.ignore_eos and not sp.detokenize


def test_sampling_seeds_order_and_raw_logprobs(fake_vllm, policy):
    model, tok = policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9)
    gen = engine.generate(PROMPTS[:3], 3, params, generator=torch.Generator().manual_seed(7))
    again = engine.generate(PROMPTS[:3], 3, params, generator=torch.Generator().manual_seed(7))
    other = engine.generate(PROMPTS[:3], 3, params, generator=torch.Generator().manual_seed(8))
    llm = FakeLLM.instances[0]
    seeds = [[sp.seed for sp in sps] for _, sps in llm.calls]
    base = seeds[0][0]
    assert seeds[0] == list(range(base, base + 9)) == seeds[1]  # one seed per sample, reproducible
    assert seeds[2][0] != base
    assert gen.tokens == again.tokens and gen.logprobs == again.logprobs
    assert gen.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for sp in llm.calls[0][1]:
        assert (sp.temperature, sp.top_p, sp.n, sp.logprobs) == (0.7, 0.9, 1, 0)
    # logprobs: the raw (temperature 1, untruncated) log-softmax at the sampled token, read from
    # the sampled id's entry even where the top-1 token differs
    off_top = 0
    with torch.no_grad():
        for prompt, toks, lps in zip(gen.prompt_ids, gen.tokens, gen.logprobs):
            logits = model(torch.tensor([prompt + toks])).logits[0, len(prompt) - 1 : -1].float()
            raw = torch.log_softmax(logits, -1)
            want = raw.gather(-1, torch.tensor(toks)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(lps), want, atol=1e-5)
            tempered = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(toks)[:, None]).squeeze(-1)
            assert not torch.allclose(want, tempered, atol=1e-3)
            off_top += int((logits.argmax(-1) != torch.tensor(toks)).sum())
    assert off_top > 0
    assert other.tokens != gen.tokens


def test_seed_source_global_rng_and_greedy_draws_nothing(fake_vllm, policy):
    model, tok = policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    sample = SamplingParams(max_new_tokens=2, temperature=1.0)
    torch.manual_seed(3)
    engine.generate(PROMPTS[:1], 2, sample)
    torch.manual_seed(3)
    engine.generate(PROMPTS[:1], 2, sample)
    llm = FakeLLM.instances[0]
    assert llm.calls[0][1][0].seed == llm.calls[1][1][0].seed
    g = torch.Generator().manual_seed(11)
    state = g.get_state()
    engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2, temperature=0.0), generator=g)
    assert torch.equal(g.get_state(), state)
    engine.seeded = False  # vLLM's engine-wide RNG instead of per-request seeds
    engine.generate(PROMPTS, 2, sample, generator=g)
    assert [sp.seed for sp in llm.calls[-1][1]] == [None] * 8 and torch.equal(g.get_state(), state)


def test_request_checks(fake_vllm, policy):
    model, tok = policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    with pytest.raises(ValueError, match=r"vLLM accepts temperature in \[0, 2.0\], got 2.5"):
        engine.generate(PROMPTS, 1, SamplingParams(temperature=2.5))
    with pytest.raises(ValueError, match="budgets"):
        engine.generate(PROMPTS, 1, SamplingParams(), budgets=[1])
    FakeLLM.instances[0].reverse_outputs = True
    with pytest.raises(RuntimeError, match="answers another prompt than request 0"):
        engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2, temperature=0.0))


# ----------------------------------------------------------------------------- construction, weights


def test_one_vllm_instance_per_architecture_and_its_arguments(fake_vllm, policy, tmp_path):
    model, tok = policy
    a = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    b = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    assert len(FakeLLM.instances) == 1 and a.llm is b.llm
    llm = FakeLLM.instances[0]
    assert llm.kwargs == {
        "dtype": "float32",
        "gpu_memory_utilization": 0.5,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        "seed": 0,
        "skip_tokenizer_init": True,
        "logprobs_mode": "raw_logprobs",
        "worker_extension_cls": "creditrl.policy.engines.vllm.WeightSyncExtension",
    }
    # the temporary save holds the model's weights: nothing to sync before the first generate
    assert not a.stale
    assert all(torch.equal(p, llm.hf.state_dict()[n]) for n, p in model.named_parameters())
    # other options: another instance; a model directory: used as is, synced at first use
    c = make_engine(
        model,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        kind="vllm",
        vllm_options={"gpu_memory_utilization": 0.3, "enable_prefix_caching": False, "enforce_eager": True},
    )
    assert len(FakeLLM.instances) == 2 and c.llm is not a.llm
    assert FakeLLM.instances[1].kwargs["gpu_memory_utilization"] == 0.3
    model.save_pretrained(tmp_path / "init")
    d = make_engine(
        model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm", model_path=str(tmp_path / "init")
    )
    assert FakeLLM.instances[2].model_path == str(tmp_path / "init") and d.stale
    d.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=1, temperature=0.0))
    assert len(FakeLLM.instances[2].loads) == 1 and not d.stale


def test_sync_sends_every_parameter(fake_vllm, policy):
    model, tok = policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")
    llm = FakeLLM.instances[0]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    assert engine.stale
    assert engine.sync() == 1
    (sent,) = llm.loads
    assert sent == {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied embedding once
    assert llm.rpcs == [("creditrl_load_weights", llm.rpcs[0][1])] and llm.rpcs[0][1][0].endswith(".safetensors")
    assert llm.prefix_resets == 1 and not engine.stale
    assert all(torch.equal(p, llm.hf.state_dict()[n]) for n, p in model.named_parameters())
    assert engine.stats()["time/sync_s"] > 0 and engine.stats()["time/sync_s"] == 0


def test_generate_follows_optimizer_updates(fake_vllm, peaked_tiny):
    model, tok = peaked_tiny(0, 123)
    pad = tok.pad_token_id
    eos, _ = pick_enders(model, pad)
    engine = make_engine(model, eos_id=eos, pad_id=pad, kind="vllm")
    llm = FakeLLM.instances[0]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate(PROMPTS, 1, greedy)
    engine.generate(PROMPTS, 1, greedy)
    assert llm.loads == []  # unchanged weights: no sync
    opt = torch.optim.AdamW(model.parameters(), lr=0.2)
    loss = model(torch.tensor([PROMPTS[2]]), labels=torch.tensor([PROMPTS[2]])).loss
    loss.backward()
    opt.step()
    after = engine.generate(PROMPTS, 1, greedy)
    assert len(llm.loads) == 1
    ref = HFEngine(model, eos_id=eos, pad_id=pad).generate(PROMPTS, 1, greedy)
    assert after.tokens == ref.tokens and after.tokens != before.tokens
    # a new policy object (a resumed run) is synced too
    fresh, _ = peaked_tiny(0, 123)
    engine.model = fresh
    assert engine.generate(PROMPTS, 1, greedy).tokens == before.tokens and len(llm.loads) == 2


def test_lora_is_refused(fake_vllm, policy):
    from creditrl.policy.model import apply_lora

    model, tok = policy
    lora = apply_lora(model, r=2, alpha=4, dropout=0.0, targets="q_proj")
    with pytest.raises(ValueError, match="cannot run LoRA"):
        make_engine(lora, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="vllm")


def test_trainer_runs_on_the_vllm_engine(fake_vllm, tmp_path):
    """RLTrainer with policy.engine=vllm (through the double): rollouts and evaluations share one
    vLLM instance, and each generate after an optimizer update first syncs the new weights."""
    from creditrl.train.rl import RLTrainer

    cfg = load_config(
        overrides=[
            "policy.engine=vllm",
            "train.init=policy",
            "train.iterations=2",
            "train.eval_every=2",
            "train.eval_size=4",
            "rollout.prompts_per_iter=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "train.progress=false",
            "train.inspect_every=0",
            "train.checkpoint_every=100",
        ]
    )
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    result = trainer.run()
    assert [r["iteration"] for r in result.history] == [0, 1, 2]
    (llm,) = FakeLLM.instances
    assert len(llm.calls) >= 3 and len(llm.loads) == 2  # updates after iterations 1 and 2, synced lazily
    held = llm.hf.state_dict()
    assert all(torch.equal(p, held[n]) for n, p in trainer.parts.model.named_parameters())
