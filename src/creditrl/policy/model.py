"""Policy loading: any Hugging Face causal LM by local path or hub name, the built-in ``tiny``
preset, LoRA adapters (``peft``) on top of either.

The ``tiny`` preset is a Llama-style decoder of about 0.9M parameters built from a config
(no download) with the character tokenizer of :mod:`creditrl.policy.tokenizer`.
"""

from __future__ import annotations

import json
import math
import typing
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

from creditrl.config import Config
from creditrl.config.types import ChatTemplate, Dtype
from creditrl.errors import ConfigError
from creditrl.policy.tokenizer import DEFAULT_CONTEXT, build_char_tokenizer, set_prompt_limit


@dataclass
class TinyPreset:
    """Shape of the embedded default model (Llama architecture)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 2048  # RoPE: only the config value (long-output tasks reach ~1,100 positions)


def build_tiny(
    seed: int = 0, preset: TinyPreset | None = None, tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build the tiny policy from scratch with a seeded initialisation, on ``tokenizer``'s
    vocabulary and special tokens (default: the character tokenizer)."""
    preset = preset or TinyPreset()
    tokenizer = tokenizer if tokenizer is not None else build_char_tokenizer()
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


LORA_BASE_FILE = "creditrl_lora_base.json"  # in a LoRA checkpoint: the base model it adapts
DTYPES = typing.get_args(Dtype)
CHAT_TEMPLATES = typing.get_args(ChatTemplate)


def sharpen(model: PreTrainedModel, weight_seed: int) -> PreTrainedModel:
    """Overwrite ``model``'s matrices with seeded N(0, 1/fan_in) weights and its final norm with
    3: peaked, context-dependent next-token distributions, so that sampling and greedy checks
    of an untrained tiny model are not decided by near-ties (engine tests and GPU checks)."""
    gen = torch.Generator().manual_seed(weight_seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
        model.model.norm.weight.fill_(3.0)
    return model.eval()


def load_policy(
    name_or_path: str,
    seed: int = 0,
    *,
    dtype: str = "float32",
    local_files_only: bool = True,
    chat_template: str = "auto",
    max_prompt_tokens: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``tiny`` (built locally), a causal LM + tokenizer saved at a local path, a LoRA
    checkpoint (a directory with ``creditrl_lora_base.json``: its base is loaded, then the
    adapter on top, trainable), or a hub name.

    Hub names are read from the local HF cache only, unless ``local_files_only=False``
    (``policy.local_files_only``): creditrl never downloads at run time unless asked to.
    ``dtype`` is the weights' dtype (``float32``, ``bfloat16``, ``float16``). ``chat_template``:
    ``auto`` keeps the tokenizer's chat template if it has one (prompts are then rendered through
    it, see :func:`creditrl.policy.tokenizer.encode_prompt`), ``template`` requires one, ``none``
    removes it (raw prompts). ``max_prompt_tokens`` (``rollout.max_prompt_tokens``) is the
    tokenizer's prompt limit (:func:`creditrl.policy.tokenizer.set_prompt_limit`); 0: the model's
    context (:func:`context_length`).
    """
    if dtype not in DTYPES:
        raise ValueError(f"policy.dtype: expected one of {DTYPES}, got '{dtype}'")
    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"policy.chat_template: expected one of {CHAT_TEMPLATES}, got '{chat_template}'")
    torch_dtype = getattr(torch, dtype)
    path = Path(name_or_path)
    if name_or_path == "tiny":
        model, tokenizer = build_tiny(seed)
        model = model.to(torch_dtype)
    elif (path / LORA_BASE_FILE).exists():
        from peft import PeftModel

        base = json.loads((path / LORA_BASE_FILE).read_text())["base"]
        model, _ = load_policy(base, seed, dtype=dtype, local_files_only=local_files_only, chat_template="auto")
        model = PeftModel.from_pretrained(model, path, is_trainable=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    else:
        if not path.exists() and (local_files_only and not _in_hub_cache(name_or_path)):
            raise FileNotFoundError(
                f"policy.model: '{name_or_path}' is neither 'tiny', an existing local directory, nor a hub "
                "model in the local HF cache (creditrl does not download at run time unless "
                "policy.local_files_only=false)"
            )
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=local_files_only)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, local_files_only=local_files_only, dtype=torch_dtype)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    if chat_template == "none":
        tokenizer.chat_template = None
    elif chat_template == "template" and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"policy.chat_template: 'template', but the tokenizer of '{name_or_path}' has no chat template"
        )
    set_prompt_limit(tokenizer, max_prompt_tokens or context_length(model))
    return model, tokenizer


def context_length(model: PreTrainedModel) -> int:
    """The positions ``model`` was built for: its config's ``max_position_embeddings`` (or GPT-2's
    ``n_positions``), else :data:`~creditrl.policy.tokenizer.DEFAULT_CONTEXT`."""
    config = model.config
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_CONTEXT


def _in_hub_cache(name: str) -> bool:
    """Whether the hub model ``name`` (``org/model``) has a config in the local HF cache."""
    if name.count("/") != 1 or name.startswith((".", "/")):
        return False
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of ``model``'s linear layers (``nn.Linear`` and GPT-2's ``Conv1D``)."""
    from transformers.pytorch_utils import Conv1D

    return sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
    )


def apply_lora(model: PreTrainedModel, *, r: int, alpha: float, dropout: float, targets: str) -> PreTrainedModel:
    """Wrap ``model`` with LoRA adapters (``peft``) on ``targets``: ``all-linear`` (PEFT's option:
    every linear layer but the output head, whatever the architecture names them) or
    comma-separated module names, each of which must name one of the model's linear layers. Only
    the adapters train (B starts at 0, so the wrapped model equals the base at first)."""
    from peft import LoraConfig, get_peft_model

    names = [t.strip() for t in targets.split(",") if t.strip()]
    if r < 1 or not names:
        raise ValueError(
            f"policy.lora_r must be >= 1 and policy.lora_targets non-empty; got r={r}, targets='{targets}'"
        )
    if names != ["all-linear"]:
        linear = linear_module_names(model)
        unknown = [n for n in names if n not in linear]
        if unknown:
            raise ConfigError(
                f"policy.lora_targets: {', '.join(unknown)} not among this model's linear modules "
                f"({', '.join(linear)}); or use all-linear"
            )
    target: str | list[str] = "all-linear" if names == ["all-linear"] else names
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def policy_options(cfg: Config) -> dict:
    """The :func:`load_policy` keyword arguments a config's ``policy`` section sets."""
    p = cfg.policy
    return {
        "dtype": p.dtype,
        "local_files_only": p.local_files_only,
        "chat_template": p.chat_template,
        "max_prompt_tokens": cfg.rollout.max_prompt_tokens,
    }
