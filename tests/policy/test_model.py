"""Policy loading: the tiny preset and any local HF causal LM directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from creditrl.policy.engines import HFEngine, SamplingParams
from creditrl.policy.model import build_tiny, count_parameters, load_policy
from creditrl.policy.tokenizer import build_char_tokenizer


def test_tiny_preset_is_about_one_million_parameters_and_seeded() -> None:
    model, tok = build_tiny(0)
    assert count_parameters(model) == 865_792
    assert model.config.vocab_size == len(tok) == 99
    again, _ = build_tiny(0)
    other, _ = build_tiny(1)
    w = model.model.embed_tokens.weight
    assert torch.equal(w, again.model.embed_tokens.weight)
    assert not torch.equal(w, other.model.embed_tokens.weight)


def test_saved_tiny_loads_back_with_identical_logits(tmp_path: Path) -> None:
    model, tok = build_tiny(3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(str(tmp_path))
    ids = torch.tensor([tok("7+3*2=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert loaded_tok.decode(ids[0]) == "7+3*2="


def test_any_local_causal_lm_directory_works_with_the_engine(tmp_path: Path) -> None:
    """A Qwen2-architecture model saved locally loads through AutoModelForCausalLM and samples."""
    tok = build_char_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, loaded_tok = load_policy(str(tmp_path))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    engine = HFEngine(model, eos_id=loaded_tok.eos_token_id, pad_id=loaded_tok.pad_token_id)
    gen = engine.generate(
        [[1, 20], [1, 21, 22]], 3, SamplingParams(max_new_tokens=5), generator=torch.Generator().manual_seed(0)
    )
    assert gen.prompt_index == [0, 0, 0, 1, 1, 1]
    assert all(1 <= len(t) <= 5 for t in gen.tokens)
    assert all(lp <= 0.0 for row in gen.logprobs for lp in row)


def test_missing_path_says_no_downloads(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not download"):
        load_policy(str(tmp_path / "nope"))
