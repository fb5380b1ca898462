"""policy.device and policy.precision: device names, batch moves, and bf16/fp16 mixed precision
in generation, the update (recomputed old log-probs, fp16 loss scaling) and SFT, on the CPU.

No GPU is needed: autocast runs bf16 and fp16 on the CPU too, and the ``meta`` device stands in
for a second device where only placement is checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from creditrl.config import ConfigError, load_config
from creditrl.policy.device import autocast, resolve_device
from creditrl.policy.engines import HFEngine, SamplingParams, StaticEngine, make_engine
from creditrl.policy.model import load_policy
from creditrl.rollout.batch import batch_from_generation, response_logprobs
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer
from creditrl.train.sft import sft_key, train_sft

TINY = [
    "task.args={min_ops: 1, max_ops: 2}",
    "sft.steps=4",
    "sft.batch_size=8",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=16",
    "train.eval_size=8",
    "train.progress=false",
    "train.threads=1",
    "train.init=policy",
]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- device names


def test_device_names(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(
        ValueError, match="policy.device: 'cuda' but torch sees no CUDA device .* use policy.device=cpu or auto"
    ):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="policy.device: expected cpu, cuda, cuda:N or auto, got 'gpu'"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "2")  # torchrun: rank 2 of this node takes the third GPU
    assert resolve_device("cuda") == torch.device("cuda:2")
    assert resolve_device("auto") == torch.device("cuda:2")
    assert resolve_device("cuda:3") == torch.device("cuda:3")
    with pytest.raises(ValueError, match="policy.device: 'cuda:4' but torch sees 4 CUDA device"):
        resolve_device("cuda:4")


def test_config_errors_name_the_key(monkeypatch):
    with pytest.raises(ConfigError, match="policy.precision: unknown value 'fp8'; valid: bf16, fp16, fp32"):
        checked(load_config(overrides=["policy.precision=fp8"]))
    with pytest.raises(ConfigError, match="loss.recompute_logprobs: not supported with backend.learner=fsdp"):
        checked(load_config(overrides=["policy.precision=bf16", "backend.learner=fsdp"]))
    with pytest.raises(ConfigError, match="loss.recompute_logprobs: not supported with backend.learner=fsdp"):
        checked(load_config(overrides=["loss.recompute_logprobs=always", "backend.learner=fsdp"]))
    assert load_config(overrides=["backend.learner=fsdp"]).backend.learner == "fsdp"  # fp32, auto: no recompute
    with pytest.raises(ConfigError, match="the Ray backend's rollout workers sample in fp32"):
        checked(load_config(overrides=["policy.precision=bf16", "backend.name=ray"]))
    with pytest.raises(
        ConfigError, match="loss.recompute_logprobs: unknown value 'sometimes'; valid: always, auto, never"
    ):
        checked(load_config(overrides=["loss.recompute_logprobs=sometimes"]))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="policy.device: 'cuda' but torch sees no CUDA device"):
            checked(load_config(overrides=["policy.device=cuda"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    with pytest.raises(ConfigError, match="policy.engine: the static engine is written for the CPU"):
        checked(load_config(overrides=["policy.device=cuda:0", "policy.engine=static"]))
    with pytest.raises(ConfigError, match="the Ray backend's rollout workers run on the CPU"):
        checked(load_config(overrides=["policy.device=cuda:0", "backend.name=ray"]))
    assert load_config(overrides=["policy.device=cuda:0", "policy.precision=bf16"]).policy.device == "cuda:0"


def test_sft_cache_key_changes_only_when_set():
    base = load_config()
    assert sft_key(load_config(overrides=["policy.device=cpu", "policy.precision=fp32"])) == sft_key(base)
    assert sft_key(load_config(overrides=["policy.precision=bf16"])) != sft_key(base)


# ----------------------------------------------------------------------------- placement


def _batch(model, tok, n=3):
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    prompts = [tok("1+2=")["input_ids"], tok("3*4-5=")["input_ids"]]
    gen = engine.generate(
        prompts, n, SamplingParams(max_new_tokens=8, temperature=1.0), generator=torch.Generator().manual_seed(0)
    )
    return batch_from_generation(gen, gen.prompt_index, tok.pad_token_id)


def test_batch_moves_every_tensor_and_shares_extras():
    model, tok = load_policy("tiny")
    batch = _batch(model, tok)
    batch.extras["texts"] = ["x"] * batch.size
    assert batch.to("cpu") is batch
    moved = batch.to("meta")
    for name, value in vars(moved).items():
        if name != "extras":
            assert value.device.type == "meta", name
            assert value.shape == getattr(batch, name).shape and value.dtype == getattr(batch, name).dtype
    assert moved.extras is batch.extras


def test_static_engine_refuses_a_model_off_the_cpu():
    model, tok = load_policy("tiny")
    model.to("meta")
    with pytest.raises(
        ValueError, match="StaticEngine cannot run this model: it is written for the CPU and the model is on 'meta'"
    ):
        StaticEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert isinstance(make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind="auto"), HFEngine)


# ----------------------------------------------------------------------------- mixed precision


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("kind", ["hf", "static"])
def test_engines_sample_under_autocast(precision, kind):
    model, tok = load_policy("tiny", seed=3)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts = [tok("7+3*2-5=")["input_ids"]]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    full = make_engine(model, eos_id=eos, pad_id=pad, kind=kind)
    mixed = make_engine(model, eos_id=eos, pad_id=pad, kind=kind, precision=precision)
    a = full.generate(prompts, 16, params, generator=torch.Generator().manual_seed(1))
    b = mixed.generate(prompts, 16, params, generator=torch.Generator().manual_seed(1))
    # The same uniform draws through slightly different distributions: most tokens agree, and
    # where a row's tokens agree so far the log-probs differ by rounding only.
    same = [x == y for x, y in zip(a.tokens, b.tokens)]
    assert sum(same) >= 8, sum(same)
    gaps = [
        abs(p - q) for x, y, lx, ly in zip(a.tokens, b.tokens, a.logprobs, b.logprobs) if x == y for p, q in zip(lx, ly)
    ]
    assert 0 < max(gaps) < 0.1, max(gaps)
    # and the mixed engine's log-probs are those of the autocast forward pass itself
    batch = batch_from_generation(b, b.prompt_index, pad)
    with torch.no_grad(), autocast("cpu", precision):
        forward = response_logprobs(model, batch)
    got = torch.where(batch.response_mask, batch.old_logprobs, 0)
    want = torch.where(batch.response_mask, forward, 0)
    assert (got - want).abs().max() < 0.05


def test_fp32_recompute_matches_the_sampler(tmp_path: Path):
    cfg = load_config(overrides=TINY + ["train.iterations=1", "loss.recompute_logprobs=always"])
    RLTrainer.from_config(cfg, tmp_path / "run").run()
    gap = rows(tmp_path / "run")[1]["policy/sampler_logprob_gap"]
    assert 0 <= gap < 1e-5, gap  # the engine returns the training forward's log-probs in fp32


def test_bf16_run_keeps_float32_weights_and_logs_the_gap(tmp_path: Path):
    # the untrained policy earns no reward: the entropy bonus gives the update a gradient
    cfg = load_config(overrides=TINY + ["train.iterations=2", "policy.precision=bf16", "loss.entropy_coef=0.01"])
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    before = [p.detach().clone() for p in trainer.parts.model.parameters()]
    trainer.run()
    history = rows(tmp_path / "run")
    assert all(p.dtype == torch.float32 for p in trainer.parts.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.parts.model.parameters()))
    for row in history[1:]:
        assert 1e-5 < row["policy/sampler_logprob_gap"] < 0.1, row["policy/sampler_logprob_gap"]
        # old log-probs recomputed by the update's own (autocast) forward: the first epoch's
        # ratio is 1 up to bf16 rounding, so no token is clipped
        assert row["policy/clipfrac"] == 0.0
        assert abs(row["policy/approx_kl"]) < 1e-3
        assert all(v == v and abs(v) != float("inf") for v in row.values() if isinstance(v, float))
    assert "optim/loss_scale" not in history[1]  # bf16 needs no loss scaling


def test_fp16_scaler_is_logged_and_resumed(tmp_path: Path):
    over = TINY + [
        "policy.precision=fp16",
        "train.iterations=4",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "loss.entropy_coef=0.01",
    ]
    RLTrainer.from_config(load_config(overrides=over), tmp_path / "full").run()
    part = RLTrainer.from_config(load_config(overrides=over + ["train.iterations=2"]), tmp_path / "part")
    part.run()
    cfg_text = (tmp_path / "part" / "config.yaml").read_text().replace("\n  iterations: 2\n", "\n  iterations: 4\n")
    (tmp_path / "part" / "config.yaml").write_text(cfg_text)
    resumed = RLTrainer.resume(tmp_path / "part")
    assert (
        resumed.parts.scaler is not None
        and resumed.parts.scaler.get_scale() == rows(tmp_path / "part")[2]["optim/loss_scale"]
    )
    resumed.run()
    a, b = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert a[1]["optim/loss_scale"] == 65536.0  # torch's initial scale
    for ra, rb in zip(a, b, strict=True):
        for key in ra:
            if not key.startswith("time/"):
                assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["iteration"], key)


def test_bf16_sft_trains_float32_weights(tmp_path: Path):
    cfg = load_config(overrides=TINY + ["policy.precision=bf16"])
    model, _, metrics = train_sft(cfg, tmp_path / "sft", progress=False)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert 0 < metrics["sft/final_loss"] < 10
    assert 0.0 <= metrics["eval/accuracy"] <= 1.0
