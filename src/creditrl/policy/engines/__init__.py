"""Generation engines: the protocol (:mod:`.base`), the HF reference engine (:mod:`.hf`), the
static-cache CPU engine with its fused decoder, KV caches and compiled kernels (:mod:`.static`,
:mod:`.decoder`, :mod:`.kv_cache`, :mod:`.kernels`), the compiled-step engine (:mod:`.compiled`, CUDA
graphs on CUDA) and the vLLM engine (:mod:`.vllm`, CUDA).

:func:`make_engine` builds the one ``policy.engine`` names (:func:`choose_engine` resolves ``auto``)."""

from creditrl.policy.engines.base import (
    Generation,
    GenerationEngine,
    InProcessEngine,
    SamplingParams,
    advance_generator,
    expand_requests,
    generate_chunked,
    left_pad,
    positions_from_mask,
    sample_step,
)
from creditrl.policy.engines.compiled import CompiledEngine
from creditrl.policy.engines.hf import HFEngine
from creditrl.policy.engines.select import ENGINES, choose_engine, engine_for, make_engine
from creditrl.policy.engines.static import KERNELS, StaticEngine

__all__ = [
    "ENGINES",
    "KERNELS",
    "CompiledEngine",
    "Generation",
    "GenerationEngine",
    "HFEngine",
    "InProcessEngine",
    "SamplingParams",
    "StaticEngine",
    "advance_generator",
    "choose_engine",
    "engine_for",
    "expand_requests",
    "generate_chunked",
    "left_pad",
    "make_engine",
    "positions_from_mask",
    "sample_step",
]
