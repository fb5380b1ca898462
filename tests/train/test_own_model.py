"""RL on the model you name: a GPT-2 and a Qwen2 built from configs and saved locally start RL at
once (no supervised warm start), and LoRA's default targets fit both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config

from creditrl.config import load_config
from creditrl.errors import ConfigError
from creditrl.policy.model import apply_lora, build_tiny, linear_module_names
from creditrl.train import build as build_module
from creditrl.train.resolve import checked
from creditrl.train.rl import RLTrainer
from small_runs import MINI_RUN

RUN = [*MINI_RUN, "train.iterations=1", "train.checkpoint_every=1"]


def _config(kind: str, vocab: int, tok) -> object:
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    if kind == "gpt2":
        return GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=128, **ids)
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        **ids,
    )


@pytest.fixture(scope="module", params=["gpt2", "qwen2"])
def model_dir(request, tmp_path_factory) -> Path:
    """A small random-init model of the family, saved with the embedded preset's tokenizer."""
    _, tok = build_tiny(0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(request.param, len(tok), tok))
    out = tmp_path_factory.mktemp(request.param) / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_a_named_model_starts_rl_at_once(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sft(*a, **k):
        raise AssertionError("the supervised warm start ran")

    monkeypatch.setattr(build_module, "cached_sft", no_sft)
    cfg = load_config(overrides=RUN + [f"policy.model={model_dir}"])
    assert cfg.train.init == "auto" and checked(cfg).train.init == "policy"
    assert checked(load_config(overrides=RUN)).train.init == "sft"  # the embedded tiny preset needs it
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    trainer.run()
    assert trainer.parts.init_path == str(model_dir)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]


def test_lora_with_the_default_targets_fits_the_architecture(model_dir: Path, tmp_path: Path) -> None:
    # an entropy term: a gradient whatever the rewards of a random model (all 0, so no advantage)
    over = [f"policy.model={model_dir}", "policy.lora_r=2", "loss.entropy_coef=0.01", "optim.lr=0.01"]
    cfg = load_config(overrides=RUN + over)
    assert cfg.policy.lora_targets == "all-linear"
    trainer = RLTrainer.from_config(cfg, tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.parts.model.named_parameters()}
    trainer.run()
    changed = {n for n, p in trainer.parts.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all("lora_" in n for n in changed)  # only adapters train
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in changed}
    linear = set(linear_module_names(AutoModelForCausalLM.from_pretrained(model_dir)))
    assert adapted and adapted <= linear and "lm_head" not in adapted


def test_unknown_lora_targets_name_the_models_linear_modules(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    linear = linear_module_names(model)
    with pytest.raises(ConfigError) as err:
        apply_lora(model, r=2, alpha=4, dropout=0.0, targets="q_proj,nope")
    message = str(err.value)
    assert "\n" not in message and message.startswith("policy.lora_targets: ")
    assert f"not among this model's linear modules ({', '.join(linear)}); or use all-linear" in message
    assert ("c_attn" in linear) == ("gpt2" in str(model_dir))


@pytest.mark.parametrize("lora", ["none", "adapters", "merged"])
def test_the_run_leaves_a_final_model_and_a_latest_checkpoint_that_load(
    model_dir: Path, tmp_path: Path, lora: str
) -> None:
    over = [f"policy.model={model_dir}", "loss.entropy_coef=0.01", "optim.lr=0.01"]
    if lora != "none":
        over += ["policy.lora_r=2", f"train.merge_lora={str(lora == 'merged').lower()}"]
    trainer = RLTrainer.from_config(load_config(overrides=RUN + over), tmp_path / "run")
    trainer.run()
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    trainer.parts.model.eval()
    with torch.no_grad():
        want = trainer.parts.model(input_ids=ids).logits
        for where in ("final", "checkpoints/latest"):
            if where != "final" and lora != "none":
                continue  # a LoRA checkpoint holds the adapters and its resume state
            loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / where).eval()
            assert torch.allclose(loaded(input_ids=ids).logits, want, atol=1e-5), where
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").exists() == (lora == "adapters")
    assert (final / "tokenizer.json").exists() and (tmp_path / "run" / "checkpoints" / "latest").is_symlink()


def test_creditrl_sft_out_writes_a_loadable_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from creditrl.cli import main

    monkeypatch.setenv("CREDITRL_CACHE", str(tmp_path / "cache"))
    sets = ["sft.steps=3", "sft.batch_size=4", "sft.warmup_steps=1", "train.eval_size=4", "train.progress=false"]
    argv = ["sft", *[x for kv in sets + [RUN[0]] for x in ("--set", kv)], "--out", str(tmp_path / "warm")]
    assert main(argv) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "warm")
    assert model.config.model_type == "llama" and (tmp_path / "warm" / "tokenizer.json").exists()
    assert not (tmp_path / "warm" / "trainer_state.json").exists()
    assert main(argv) == 2  # not empty now: refused, nothing overwritten


def test_push_to_hub_uploads_the_final_folder(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tested up to the hub client's calls: the repo is created and ``final/`` is what is uploaded."""
    import huggingface_hub

    calls = []

    def create_repo(self, repo_id, repo_type, exist_ok):
        calls.append(("create", repo_id, repo_type, exist_ok))

    def upload_folder(self, folder_path, repo_id, repo_type):
        calls.append(("upload", Path(folder_path).name, sorted(p.name for p in Path(folder_path).iterdir()), repo_id))
        return huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/0", commit_message="", commit_description="", oid="0"
        )

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    over = [f"policy.model={model_dir}", "train.push_to_hub=me/tiny-rl"]
    with pytest.raises(ConfigError, match="^train.push_to_hub: uploading to 'me/tiny-rl' needs the network; set "):
        checked(load_config(overrides=RUN + over))
    RLTrainer.from_config(load_config(overrides=RUN + over + ["policy.local_files_only=false"]), tmp_path / "run").run()
    assert calls[0] == ("create", "me/tiny-rl", "model", True)
    assert calls[1][0:2] == ("upload", "final") and calls[1][3] == "me/tiny-rl"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(calls[1][2])


def test_a_failed_push_is_one_line_and_keeps_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    from creditrl.train.checkpoint import push_folder

    def offline(self, *a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co'.\nCheck your connection.")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", offline)
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as err:
        push_folder(tmp_path / "final", "me/x")
    assert str(err.value) == (
        f"train.push_to_hub: cannot upload {tmp_path / 'final'} to 'me/x': We couldn't connect to "
        "'https://huggingface.co'. Check your connection."
    )
    assert (tmp_path / "final" / "config.json").exists()
