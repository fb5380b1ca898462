"""The config's building blocks: the closed choice sets (one definition each; their owners read
them from here), the read-only task-argument mapping, and the frozen, strict section base."""

from __future__ import annotations

from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, PlainSerializer

Dtype = Literal["float32", "bfloat16", "float16"]
Precision = Literal["fp32", "bf16", "fp16"]
Kernels = Literal["auto", "numba", "torch"]
Forward = Literal["auto", "hf"]
ChatTemplate = Literal["auto", "template", "none"]
OnError = Literal["raise", "zero", "skip"]
Resolution = Literal["auto", "token", "step"]
Recompute = Literal["auto", "always", "never"]
CriticModel = Literal["separate", "shared"]
KLEstimator = Literal["k1", "k2", "k3"]
Split = Literal["train", "heldout"]
BackendName = Literal["local", "ray"]
Learner = Literal["ddp", "fsdp"]
SearchMethod = Literal["greedy", "best_of_n", "beam", "mcts"]
LeafValue = Literal["prm", "rollout_orm", "rollout_oracle"]

# task constructor arguments: a read-only mapping (a frozen config), written out as a plain dict
FrozenArgs = Annotated[
    dict[str, Any],
    AfterValidator(lambda v: MappingProxyType(dict(v))),
    PlainSerializer(lambda v: dict(v), return_type=dict),
]


class Section(BaseModel):
    """A frozen, strictly typed section: unknown keys and wrong types are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=True)
