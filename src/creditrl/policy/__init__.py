"""Policy: HF model/tokenizer loading, the tiny preset, and the generation engine."""

from creditrl.policy.engines import Generation, GenerationEngine, HFEngine, SamplingParams, StaticEngine, make_engine
from creditrl.policy.model import build_tiny, count_parameters, load_policy
from creditrl.policy.tokenizer import build_char_tokenizer

__all__ = [
    "Generation",
    "GenerationEngine",
    "HFEngine",
    "SamplingParams",
    "StaticEngine",
    "make_engine",
    "build_tiny",
    "count_parameters",
    "load_policy",
    "build_char_tokenizer",
]
