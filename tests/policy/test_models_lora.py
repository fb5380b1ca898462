"""Model switches: LoRA through peft, gradient checkpointing, chat templates, dtype, hub names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from creditrl.config import ConfigError, load_config
from creditrl.policy.engines import StaticEngine, make_engine
from creditrl.policy.model import LORA_BASE_FILE, apply_lora, build_tiny, load_policy
from creditrl.policy.tokenizer import encode_prompt
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer

# The easy setting of tests/train/test_rl_loop.py: a 30-step warm start already gets some sums
# right, so rewards vary within groups and the policy gradient is not zero.
EASY_TASK = "{min_ops: 1, max_ops: 1, operand_min: 1, operand_max: 2, operators: '+', heldout_mod: 2}"
SMALL = [
    f"task.args={EASY_TASK}",
    f"sft.task_args={EASY_TASK}",
    "sft.steps=30",
    "sft.batch_size=16",
    "sft.warmup_steps=5",
    "sft.lr=0.003",
    "rollout.prompts_per_iter=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=10",
    "optim.lr=1e-3",
    "train.iterations=2",
    "train.eval_every=2",
    "train.eval_size=4",
    "train.checkpoint_every=1",
    "train.progress=false",
    "train.threads=1",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from creditrl.train.sft import cached_sft

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDITRL_CACHE", str(tmp_path_factory.mktemp("cache")))
        path, _ = cached_sft(load_config(overrides=SMALL), progress=False)
    return str(path)


def test_lora_trains_only_the_adapters_and_resumes(tiny_dir: str, tmp_path: Path) -> None:
    cfg = load_config(overrides=SMALL + ["policy.lora_r=4", "policy.lora_alpha=8"])
    trainer = RLTrainer.from_config(cfg, tmp_path / "run", init_path=tiny_dir)
    assert not isinstance(trainer.parts.engine, StaticEngine)  # plain-weight engine refused for adapters
    before = {k: v.clone() for k, v in trainer.parts.model.named_parameters()}
    trainable = {k for k, v in trainer.parts.model.named_parameters() if v.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    assert sum(len(g["params"]) for g in trainer.parts.optimizer.param_groups) == len(trainable)
    trainer.run()
    after = dict(trainer.parts.model.named_parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and changed <= trainable  # base weights unchanged, adapter weights changed
    assert any("lora_B" in k for k in changed)
    ckpt = tmp_path / "run" / "checkpoints" / "iter_000002"
    assert json.loads((ckpt / LORA_BASE_FILE).read_text()) == {"base": tiny_dir}
    assert (ckpt / "adapter_config.json").exists() and not (ckpt / "model.safetensors").exists()
    reloaded, _ = load_policy(str(ckpt))  # base + adapter
    ids = torch.tensor([[1, 20, 21, 22]])
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, trainer.parts.model(input_ids=ids).logits, atol=1e-6)
    # resume from iteration 1 replays iteration 2 exactly
    part = tmp_path / "part"
    RLTrainer.from_config(
        load_config(overrides=SMALL + ["policy.lora_r=4", "policy.lora_alpha=8", "train.iterations=1"]),
        part,
        init_path=tiny_dir,
    ).run()
    (part / "config.yaml").write_text((part / "config.yaml").read_text().replace("iterations: 1", "iterations: 2"))
    resumed = RLTrainer.resume(part)
    resumed.run()
    a = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert a[-1]["reward/mean"] == pytest.approx(b[-1]["reward/mean"]) and a[-1]["iteration"] == b[-1]["iteration"] == 2
    assert a[-1]["policy/approx_kl"] == pytest.approx(b[-1]["policy/approx_kl"], abs=1e-6)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dir: str, tmp_path: Path) -> None:
    """Recomputed activations give the same gradients (recorded at the first optimizer step)."""
    grads = []
    for gc in (False, True):
        cfg = load_config(overrides=SMALL + [f"policy.gradient_checkpointing={str(gc).lower()}", "train.iterations=1"])
        trainer = RLTrainer.from_config(cfg, tmp_path / f"gc{gc}", init_path=tiny_dir)
        assert trainer.parts.model.is_gradient_checkpointing == gc
        seen: dict[str, torch.Tensor] = {}
        names = {id(p): k for k, p in trainer.parts.model.named_parameters()}
        step = trainer.parts.optimizer.step

        def record(*args, _step=step, _seen=seen, **kwargs):
            for group in trainer.parts.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None and names[id(p)] not in _seen:
                        _seen[names[id(p)]] = p.grad.clone()
            return _step(*args, **kwargs)

        trainer.parts.optimizer.step = record
        trainer.run()
        grads.append(seen)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    scale = max(float(g.abs().max()) for g in grads[0].values())
    assert scale > 0
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5 * scale, rtol=1e-4), k


def test_chat_template_renders_prompts_and_none_removes_it(tiny_dir: str, tmp_path: Path) -> None:
    model, tok = load_policy(tiny_dir)
    plain = encode_prompt(tok, "1+2=")
    assert plain == [tok.bos_token_id] + tok("1+2=", add_special_tokens=False)["input_ids"]
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[bot]{% endif %}"
    )
    assert tok.decode(encode_prompt(tok, "1+2=")) == "[user]1+2=[bot]"
    model.save_pretrained(tmp_path / "chat")
    tok.save_pretrained(tmp_path / "chat")
    _, with_template = load_policy(str(tmp_path / "chat"))
    assert with_template.decode(encode_prompt(with_template, "3=")) == "[user]3=[bot]"
    _, without = load_policy(str(tmp_path / "chat"), chat_template="none")
    assert encode_prompt(without, "1+2=") == plain


def test_dtype_and_missing_models_and_config_checks(tiny_dir: str) -> None:
    model, _ = load_policy(tiny_dir, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="policy.dtype: expected one of"):
        load_policy("tiny", dtype="float8")
    with pytest.raises(FileNotFoundError, match="nor a hub model in the local HF cache"):
        load_policy("no-such-org/no-such-model")
    with pytest.raises(ConfigError, match="'static' reads plain weights and cannot run LoRA"):
        checked(load_config(overrides=["policy.lora_r=4", "policy.engine=static"]))
    with pytest.raises(ConfigError, match="a shared critic trains the policy's trunk"):
        checked(
            load_config(
                overrides=["policy.lora_r=4", "credit.estimator=gae", "value.source=critic", "value.model=shared"]
            )
        )
    with pytest.raises(ConfigError, match="policy.lora_targets: name at least one module"):
        checked(load_config(overrides=["policy.lora_r=4", "policy.lora_targets=' , '"]))
    with pytest.raises(ValueError, match="StaticEngine cannot run this model"):
        make_engine(
            apply_lora(build_tiny(0)[0], r=2, alpha=4, dropout=0.0, targets="q_proj"), eos_id=2, pad_id=0, kind="static"
        )
