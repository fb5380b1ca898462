"""Policy loading: any Hugging Face causal LM by local path, or the built-in ``tiny`` preset.

The ``tiny`` preset is a Llama-style decoder of about 0.9M parameters built from a config
(no download) with the character tokenizer of :mod:`creditrl.policy.tokenizer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from creditrl.policy.tokenizer import build_char_tokenizer


@dataclass
class TinyPreset:
    """Shape of the embedded default model (Llama architecture)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 160


def build_tiny(seed: int = 0, preset: TinyPreset | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build the tiny policy from scratch with a seeded initialisation."""
    preset = preset or TinyPreset()
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_heads,
        max_position_embeddings=preset.max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tokenizer


def load_policy(name_or_path: str, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``tiny`` (built locally) or a causal LM + tokenizer saved at a local path.

    Paths are loaded with ``local_files_only=True``: creditrl never downloads at run time.
    """
    if name_or_path == "tiny":
        return build_tiny(seed)
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(
            f"policy.model: '{name_or_path}' is neither 'tiny' nor an existing local directory "
            "(creditrl does not download models at run time; pass a save_pretrained folder)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
