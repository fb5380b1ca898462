"""Which engine generates: ``policy.engine`` resolved against the model, and the engine built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import PreTrainedModel

from creditrl.config import PolicyConfig
from creditrl.policy.device import module_device
from creditrl.policy.engines.compiled import CompiledEngine
from creditrl.policy.engines.decoder import unsupported_reason
from creditrl.policy.engines.hf import HFEngine
from creditrl.policy.engines.static import StaticEngine

ENGINES: dict[str, str] = {
    "compiled": "static KV cache, the decode step compiled once per shape bucket (CUDA graphs on CUDA; "
    "Llama, Mistral, Qwen2, Qwen3)",
    "static": "pre-allocated KV cache and a fused decoder over the HF weights (CPU; Llama, Mistral, Qwen2, Qwen3)",
    "hf": "any HF causal LM through its own forward and KV cache",
    "vllm": "vLLM on a CUDA GPU (installed separately), weights synced after each update",
}
"""The engines ``policy.engine`` may name (``auto`` resolves to one of them)."""


def choose_engine(model: PreTrainedModel, kind: str) -> tuple[str, str]:
    """The engine ``kind`` means for ``model`` and why: ``auto`` is ``compiled`` on CUDA and ``static`` on
    the CPU when that engine can run the model, else ``hf``."""
    if kind in ENGINES:
        return kind, "as configured"
    if kind != "auto":
        raise ValueError(f"policy.engine: expected auto or one of {', '.join(ENGINES)}, got '{kind}'")
    if module_device(model).type == "cuda":
        reason = unsupported_reason(model, cpu_only=False)
        if reason is None:
            return "compiled", f"auto: the compiled engine runs {model.config.model_type} on CUDA"
        return "hf", f"auto: the compiled engine cannot run this model: {reason}"
    reason = unsupported_reason(model)
    if reason is None:
        return "static", f"auto: the static engine runs {model.config.model_type} on the CPU"
    return "hf", f"auto: the static engine cannot run this model: {reason}"


def make_engine(
    model: PreTrainedModel,
    *,
    eos_id: int,
    pad_id: int,
    kind: str = "auto",
    model_path: str | None = None,
    vllm_options: Mapping[str, Any] | None = None,
    precision: str = "fp32",
    kernels: str = "auto",
):
    """The engine ``kind`` (resolved by :func:`choose_engine`; error if it cannot run ``model``).
    The compiled engine is one per model and settings
    (:meth:`~creditrl.policy.engines.compiled.CompiledEngine.shared`), vLLM one instance per process
    and architecture, following ``model``'s weights. ``model_path`` (a directory vLLM may load
    instead of a temporary save of ``model``) and ``vllm_options`` (``VLLMEngine`` keyword
    arguments) apply to ``vllm`` only; ``precision`` (``policy.precision``) to the others;
    ``kernels`` (``policy.kernels``) to the static engine."""
    kind, _ = choose_engine(model, kind)
    if kind == "vllm":
        from creditrl.policy.engines.vllm import VLLMEngine

        return VLLMEngine(model_path, eos_id=eos_id, pad_id=pad_id, model=model, share=True, **(vllm_options or {}))
    if kind == "compiled":
        return CompiledEngine.shared(model, eos_id=eos_id, pad_id=pad_id, precision=precision)
    if kind == "hf":
        return HFEngine(model, eos_id=eos_id, pad_id=pad_id, precision=precision)
    return StaticEngine(model, eos_id=eos_id, pad_id=pad_id, precision=precision, kernels=kernels)


def engine_for(model: PreTrainedModel, tokenizer: Any, policy: PolicyConfig):
    """The engine a config's ``policy`` section names for ``model`` (its engine, precision and kernels)."""
    return make_engine(
        model,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        kind=policy.engine,
        precision=policy.precision,
        kernels=policy.kernels,
    )
