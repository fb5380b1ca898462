"""The typed configuration: one pydantic model per section, one described default per field.

Sections follow the data flow of an RL iteration (docs/design.md): rollout -> reward (+ shaping,
hybrid) -> value -> credit -> loss -> optim; then the run (train), the PRM life cycle (prm), the
scale-out backend and test-time search. A field's ``description`` is its documentation: the
config reference in README.md is generated from it (:mod:`creditrl.config.reference`).

This module checks types, ranges, closed choice sets (``Literal``) and the combinations that
need nothing but the config itself. Names that live in registries (estimators, normalisers,
reward sources, granularities, tasks, value sources, optimizers, labelers, engines, ...) are
checked against the registries when the run is built (:mod:`creditrl.train.build`), which also
resolves every ``auto`` / ``""`` / ``None``-means-default value once. Every section is frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, model_validator

from creditrl.config.validation import validated

Dtype = Literal["float32", "bfloat16", "float16"]
Precision = Literal["fp32", "bf16", "fp16"]
Kernels = Literal["auto", "numba", "torch"]
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


class PolicyConfig(Section):
    model: str = Field(
        "tiny",
        description="`tiny` (the embedded ~1M-parameter model, built locally) or a "
        "`save_pretrained` directory / hub name of a causal LM",
    )
    init_seed: int = Field(0, description="seed of the tiny model's random initialisation")
    engine: str = Field(
        "auto",
        description="generation engine (a registered engine): `static` (pre-allocated "
        "KV cache, CPU), `hf` (any HF model), `vllm` (CUDA, vLLM installed separately); `auto` "
        "resolves to `static` when the architecture allows, else `hf`",
    )
    kernels: Kernels = Field(
        "auto",
        description="static engine decode step: `numba` (compiled kernels) or "
        "`torch` (tensor ops); `auto` resolves to `numba` in fp32 when numba imports",
    )
    dtype: Dtype = Field("float32", description="dtype of the weights")
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|auto|cuda(:\d+)?)$",
        description="device of the policy, "
        "reference and critic: `cpu`, `cuda`, `cuda:N`; `auto` resolves to `cuda` when torch "
        "sees a GPU",
    )
    precision: Precision = Field(
        "fp32", description="autocast mixed precision of every forward pass (the weights stay in `dtype`)"
    )
    local_files_only: bool = Field(True, description="hub names from the local HF cache only; false allows downloads")
    chat_template: ChatTemplate = Field(
        "auto",
        description="`template` renders prompts as one user turn "
        "through the tokenizer's chat template, `none` writes bos + prompt; "
        "`auto` resolves to `template` when the tokenizer has one",
    )
    lora_r: int = Field(
        0, ge=0, description="LoRA rank of the RL policy (0 = full fine-tuning; the SFT warm start is always full)"
    )
    lora_alpha: float = Field(16.0, description="LoRA alpha")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    lora_targets: str = Field("q_proj,k_proj,v_proj,o_proj", description="comma-separated module names LoRA adapts")
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass of the RL update"
    )

    @model_validator(mode="after")
    def _lora_targets(self) -> PolicyConfig:
        if self.lora_r and not [t for t in self.lora_targets.split(",") if t.strip()]:
            raise ValueError("policy.lora_targets: name at least one module, e.g. q_proj,v_proj")
        return self


class TaskConfig(Section):
    name: str = Field(
        "arithmetic",
        description="a registered task: `arithmetic`, `math`, `code`, "
        "`toy_translate`, `toy_summarise`, or `module:Class`",
    )
    args: FrozenArgs = Field(
        default_factory=lambda: {"min_ops": 4, "max_ops": 6}, description="keyword arguments of the task's constructor"
    )


class SFTConfig(Section):
    steps: int = Field(1500, ge=0, description="optimizer steps of the supervised warm start")
    batch_size: int = Field(64, gt=0, description="problems per step")
    lr: float = Field(2e-3, gt=0, description="peak learning rate (linear warm-up, cosine decay to 10%)")
    warmup_steps: int = Field(100, ge=0, description="linear warm-up steps")
    weight_decay: float = Field(0.01, description="AdamW weight decay")
    task_args: FrozenArgs = Field(
        default_factory=lambda: {"min_ops": 1, "max_ops": 6},
        description="task arguments of the SFT problems (`{}` = `task.args`); "
        "reset to `{}` when a layer changes `task.name`",
    )
    seed: int = Field(0, description="seed of the SFT problem stream and initialisation")


class RolloutConfig(Section):
    prompts_per_iter: int = Field(16, gt=0, description="distinct prompts per RL iteration")
    group_size: int = Field(8, gt=0, description="samples per prompt (G)")
    max_new_tokens: int = Field(64, gt=0, description="longest response")
    temperature: float = Field(1.0, ge=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling threshold")


class RewardConfig(Section):
    source: str = Field(
        "outcome",
        description="a registered reward source: `outcome`, `oracle_steps`, "
        "`step_format`, `prm`, `bleu`, `chrf`, `rouge`, `unit_tests`",
    )
    granularity: str = Field(
        "",
        description="where the reward lands: `sequence`, `step`, `segment`, `token`, "
        '`key_token`; `""` resolves to the source\'s default',
    )
    on_error: OnError = Field(
        "raise",
        description="what a failing or non-finite reward does: `raise`, `zero` "
        "(the row gets 0), `skip` (the row leaves the batch)",
    )
    step_separator: str | None = Field(
        None, description="text that ends a reasoning step; null resolves to the task's separator"
    )
    cut_fn: str | None = Field(
        None, description="`module:function` cutting step/segment spans (token texts -> end indices)"
    )
    segment_tokens: int = Field(8, gt=0, description="K of fixed K-token segments")
    key_after: str = Field("=", description="key_token: a token is key when the previous token's text ends with this")
    key_fn: str | None = Field(None, description="`module:function` key-token predicate (token texts, index) -> bool")
    prm: str | None = Field(
        None,
        description="a trained PRM directory (`creditrl prm train`) for the `prm` "
        "source; `auto` resolves to a PRM trained once on the start policy's samples and cached",
    )


class ShapingConfig(Section):
    length_budget: int = Field(0, ge=0, description="tokens allowed before the length penalty starts")
    length_coef: float = Field(0.0, ge=0, description="penalty per token past the budget; 0 disables")
    overlong_cache: int = Field(
        0, ge=0, description="DAPO soft overlong buffer before `rollout.max_new_tokens`; 0 disables"
    )
    overlong_coef: float = Field(1.0, ge=0, description="DAPO overlong penalty at the limit")
    kl_coef: float = Field(0.0, ge=0, description="beta of the KL-in-reward term -beta*KL_t; 0 disables")
    kl_estimator: KLEstimator = Field("k1", description="KL estimator of the reward term")


class HybridConfig(Section):
    filter: str = Field(
        "none",
        description="which responses reach the dense rewards: `none`, `top_q`, `group_accuracy` (a registered filter)",
    )
    filter_q: float = Field(0.5, gt=0, le=1, description="top_q: share of responses kept")
    filter_lo: float = Field(0.2, description="group_accuracy: keep groups whose accuracy lies in [lo, hi]")
    filter_hi: float = Field(0.8, description="group_accuracy: upper end of the kept accuracy range")
    dense_source: str = Field(
        "", description='a second reward source mixed in as w_seq*reward + w_dense*dense; `""` = none'
    )
    dense_granularity: str = Field("", description='granularity of the dense source; `""` resolves to its default')
    schedule: str = Field(
        "constant",
        description="the mix weights over training: `constant`, `switch`, `linear`, `decay` (a registered schedule)",
    )
    switch_at: float = Field(0.8, ge=0, le=1, description="switch: share of training that is sequence-only")
    dense_weight: float = Field(1.0, ge=0, description="weight of the dense source")
    calibrate: bool = Field(False, description="scale the dense weight by its running agreement with the outcome")
    calibration_momentum: float = Field(0.9, ge=0, le=1, description="momentum of that running agreement")

    @model_validator(mode="after")
    def _combinations(self) -> HybridConfig:
        if not 0 <= self.filter_lo <= self.filter_hi <= 1:
            raise ValueError(
                f"hybrid.filter_lo/filter_hi: need 0 <= lo <= hi <= 1, got [{self.filter_lo}, {self.filter_hi}]"
            )
        return self


class ValueConfig(Section):
    source: str = Field(
        "none",
        description="where values come from: `none`, `critic`, `dual_critic`, "
        "`mc` (VinePPO), `tree` (a registered value source)",
    )
    model: CriticModel = Field(
        "separate", description="critic heads on a backbone of their own or shared with the policy"
    )
    backbone: str = Field(
        "policy",
        description="separate critic's backbone: `policy` (a copy of the initial "
        "policy), `tiny`, or a local model path",
    )
    lr: float = Field(1e-4, gt=0, description="critic learning rate")
    clip_eps: float | None = Field(0.2, gt=0, description="clipped value loss; null = plain squared error")
    coef: float = Field(0.5, ge=0, description="weight of the value loss in the policy loss (shared critic)")
    warmup_iterations: int = Field(0, ge=0, description="iterations that train only the critic")
    mc_samples: int = Field(4, gt=0, description="mc: continuations per step boundary (K)")
    tree_branching: int = Field(2, gt=0, description="tree: children per node (b)")
    tree_depth: int = Field(3, gt=0, description="tree: levels of branching (D); `rollout.group_size` must be b ** D")
    seed: int = Field(0, description="critic head initialisation")


class CreditConfig(Section):
    estimator: str = Field(
        "grpo",
        description="a registered estimator: `reinforce`, `reinforce_baseline`, "
        "`rloo`, `grpo`, `dr_grpo`, `grpo_process`, `gae`, `min_form`",
    )
    normaliser: str = Field("none", description="whitening after the estimator: `none`, `batch`, `group`")
    gamma: float = Field(1.0, ge=0, le=1, description="discount")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda (at the first iteration when `lam_end` is set)")
    lam_end: float | None = Field(
        None, ge=0, le=1, description="linear lambda schedule lam -> lam_end over training; null = constant"
    )
    resolution: Resolution = Field(
        "auto",
        description="one time step per `token` or per reasoning `step`; "
        "`auto` resolves to `step` for values that exist only at steps",
    )


class LossConfig(Section):
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO clip range")
    clip_eps_high: float | None = Field(
        None, description="asymmetric upper clip (DAPO clip-higher); null resolves to `clip_eps`"
    )
    dual_clip: float | None = Field(None, description="dual-clip constant c for negative advantages; null = off")
    kl_coef: float = Field(0.0, ge=0, description="weight of KL(pi || pi_ref) as a loss term; 0 = no reference model")
    kl_estimator: KLEstimator = Field("k3", description="KL estimator of the loss term")
    aggregation: str = Field(
        "token-mean",
        description="loss aggregation: `token-mean`, `seq-mean-token-mean`, `seq-mean-token-sum-norm` (Dr. GRPO)",
    )
    entropy_coef: float = Field(0.0, description="entropy bonus weight")
    recompute_logprobs: Recompute = Field(
        "auto",
        description="old-policy log-probs from the update's own "
        "forward: `always`, `never`; `auto` resolves to `always` when "
        "precision is not fp32",
    )


class OptimConfig(Section):
    name: str = Field("adamw", description="optimizer: `adamw`, `sgd` (heavy-ball)")
    lr: float = Field(5e-5, gt=0, description="policy learning rate")
    beta1: float = Field(0.9, ge=0, lt=1, description="adamw beta1")
    beta2: float = Field(0.99, ge=0, lt=1, description="adamw beta2")
    eps: float = Field(
        1e-8, gt=0, description="adamw eps: a larger eps moves coordinates with tiny, noisy gradients less than lr"
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd momentum")
    warmup_iterations: int = Field(0, ge=0, description="linear lr warm-up iterations")
    weight_decay: float = Field(0.0, description="weight decay")
    grad_clip: float = Field(1.0, description="gradient norm clip")
    ppo_epochs: int = Field(1, gt=0, description="passes over each batch")
    minibatches: int = Field(1, gt=0, description="optimizer steps per pass")
    micro_batch_positions: int = Field(
        4096,
        ge=0,
        description="gradient accumulation over whole groups up to this many padded positions; 0 = whole minibatch",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="leave rows whose advantages are all 0 out of the "
        "forward/backward when that is exact (no KL, entropy or critic term)",
    )


class TrainConfig(Section):
    iterations: int = Field(100, ge=0, description="RL iterations")
    eval_every: int = Field(
        10, gt=0, description="held-out greedy evaluation every N iterations (and at 0 and the end)"
    )
    eval_size: int = Field(256, gt=0, description="held-out problems per evaluation")
    checkpoint_every: int = Field(50, gt=0, description="checkpoint every N iterations (and at the end)")
    seed: int = Field(0, description="seed of every iteration's prompts and samples")
    max_tokens: int = Field(0, ge=0, description="stop once this many tokens were generated; 0 = run all iterations")
    init: str = Field(
        "sft",
        description="the start policy: `sft` (the cached warm start, resolved to its "
        "checkpoint directory), `policy` (`policy.model` as is) or a checkpoint directory",
    )
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = torch's default")
    progress: bool = Field(True, description="progress bars")
    inspect_every: int = Field(
        10, ge=0, description="save groups for `creditrl inspect` every N iterations (+ first, last); 0 = off"
    )
    inspect_groups: int = Field(2, ge=0, description="whole groups saved per recorded iteration (mixed outcomes first)")


class PRMConfig(Section):
    labeler: str = Field(
        "oracle",
        description="step labeler of `creditrl prm label`: `oracle`, "
        "`outcome_heuristic`, `mc`, `vote` (a registered labeler)",
    )
    vote_labelers: str = Field("outcome_heuristic,mc", description="comma-separated labelers for `vote`")
    vote_threshold: float = Field(1.0, gt=0, le=1, description="keep a voted label when this share of labelers agrees")
    problems: int = Field(512, gt=0, description="problems whose policy samples are labelled")
    samples: int = Field(4, gt=0, description="solutions per problem")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of those solutions")
    split: Split = Field("train", description="task split the problems come from")
    mc_n: int = Field(8, gt=0, description="mc: continuations per step prefix (N)")
    mc_mode: str = Field("hard", description="mc: `hard` (any continuation correct) or `soft` (share correct)")
    mc_temperature: float = Field(1.0, ge=0, description="sampling temperature of the MC completer")
    completer: str = Field(
        "", description='mc: checkpoint directory of the completer policy; `""` = the policy being labelled'
    )
    mc_rows_per_call: int = Field(
        8192, gt=0, description="mc: continuations an engine holds at once (memory); the samples do not depend on it"
    )
    members: int = Field(1, gt=0, description="ensemble members (each a backbone + head)")
    combine: str = Field("mean", description="ensemble combination: `mean` or `min`")
    likelihood: bool = Field(True, description="the head also reads the step's summed and minimum token log-probs")
    train_backbone: bool = Field(False, description="also fine-tune the backbone")
    steps: int = Field(600, gt=0, description="optimizer steps of PRM training")
    batch_size: int = Field(32, gt=0, description="examples per PRM step")
    lr: float = Field(
        1e-2, gt=0, description="PRM learning rate (heads only by default; 1e-3 suits a fine-tuned backbone)"
    )
    soft: bool = Field(False, description="train on soft labels (BCE toward the float)")
    augment_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of all-correct examples copied with one corrupted step (negative augmentation)",
    )
    max_step_tokens: int | None = Field(
        None, gt=0, description="drop training examples with a longer step (shortcut defence); null = keep all"
    )
    seed: int = Field(0, description="seed of labelling and training")


class BackendConfig(Section):
    name: BackendName = Field(
        "local", description="`local` (one process) or `ray` (rollout and scoring workers as Ray actors)"
    )
    rollout_workers: int = Field(2, gt=0, description="ray: generation actors; each holds a copy of the policy")
    score_workers: int = Field(0, ge=0, description="ray: reward-scoring actors (0 = score on the driver)")
    address: str = Field("", description='ray: `""` starts a local Ray instance; `auto` or host:port joins a cluster')
    worker_threads: int = Field(1, gt=0, description="ray: torch intra-op threads per actor")
    max_restarts: int = Field(3, ge=0, description="ray: times a dead actor is replaced before the run fails")
    learner: Learner = Field(
        "ddp",
        description="torchrun launches: `ddp` (a full copy per rank) or `fsdp` (the update trains a sharded copy)",
    )


class SearchConfig(Section):
    method: SearchMethod = Field("greedy", description="test-time search method")
    budget: int = Field(1024, ge=1, description="generated tokens per problem, every engine token counted")
    max_new_tokens: int = Field(96, ge=1, description="longest response of a search")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of samples, expansions and rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling threshold")
    seed: int = Field(0, description="seeds the generator every engine call draws from")
    n: int = Field(8, ge=1, description="best_of_n: samples per problem")
    selector: str = Field(
        "prm_min", description="best_of_n selector: `majority`, `orm`, `prm_min`, `prm_product`, `prm_last`, `prm_mean`"
    )
    width: int = Field(4, ge=1, description="beam: live partial solutions per problem (W)")
    expansions: int = Field(4, ge=1, description="beam, mcts: one-step samples per expanded partial solution (E)")
    min_request_tokens: int = Field(
        16, ge=1, description="beam, mcts: send an expansion/rollout only if it can get this many tokens"
    )
    aggregation: str = Field(
        "min",
        description="beam, mcts with a PRM: step scores -> partial-solution score (`min`, `product`, `last`, `mean`)",
    )
    simulations: int = Field(100, ge=1, description="mcts: most simulations per problem")
    c_puct: float = Field(1.0, ge=0, description="mcts: exploration weight in PUCT")
    leaf_value: LeafValue = Field(
        "prm",
        description="mcts leaf value: `prm`, `rollout_orm`, `rollout_oracle` (an upper bound: it uses the answer key)",
    )
    rollouts: int = Field(1, ge=1, description="mcts rollout_*: rollouts to the end per evaluated node")
    problems: int = Field(128, ge=1, description="`creditrl search`: problems searched")
    split: Split = Field("heldout", description="`creditrl search`: task split of those problems")
    problem_seed: int = Field(0, description="`creditrl search`: seed of the problem draw")
    prm: str | None = Field(None, description="PRM directory of the PRM-scored methods; null = `reward.prm`")
    orm: str | None = Field(None, description="ORM directory (`selector=orm`, `leaf_value=rollout_orm`)")

    @property
    def needs_prm(self) -> bool:
        """beam, mcts with leaf_value=prm, and best_of_n with a prm_* selector score steps with a PRM."""
        return (
            self.method == "beam"
            or (self.method == "mcts" and self.leaf_value == "prm")
            or (self.method == "best_of_n" and self.selector.startswith("prm_"))
        )

    @property
    def needs_orm(self) -> bool:
        """best_of_n with selector=orm and mcts with leaf_value=rollout_orm judge solutions with an ORM."""
        return (self.method == "best_of_n" and self.selector == "orm") or (
            self.method == "mcts" and self.leaf_value == "rollout_orm"
        )

    def describe(self) -> str:
        """The settings that matter for ``method``, e.g. ``width=4 expansions=4 aggregation=min``."""
        keys = {
            "greedy": (),
            "best_of_n": ("n", "selector", "temperature"),
            "beam": ("width", "expansions", "aggregation", "temperature"),
            "mcts": ("leaf_value", "expansions", "c_puct", "simulations", "temperature")
            + (("aggregation",) if self.leaf_value == "prm" else ("rollouts",)),
        }[self.method]
        return " ".join(f"{k}={getattr(self, k)}" for k in keys)


class Config(Section):
    """A whole run: every section, in the order of the data flow."""

    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="the policy model and its engine")
    task: TaskConfig = Field(default_factory=TaskConfig, description="the task: prompts, checkers, steps")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="the supervised warm start")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="sampling")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="reward source and granularity")
    shaping: ShapingConfig = Field(default_factory=ShapingConfig, description="shaping terms added to the rewards")
    hybrid: HybridConfig = Field(
        default_factory=HybridConfig, description="filter, dense source, schedule, calibration"
    )
    value: ValueConfig = Field(default_factory=ValueConfig, description="where values come from")
    credit: CreditConfig = Field(default_factory=CreditConfig, description="the estimator and its normaliser")
    loss: LossConfig = Field(default_factory=LossConfig, description="policy loss, KL and aggregation")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimizer and update schedule")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the run: iterations, evaluation, checkpoints")
    prm: PRMConfig = Field(default_factory=PRMConfig, description="process reward models: labelling and training")
    backend: BackendConfig = Field(default_factory=BackendConfig, description="scale-out backend")
    search: SearchConfig = Field(default_factory=SearchConfig, description="test-time search (`creditrl search`)")

    @model_validator(mode="after")
    def _combinations(self) -> Config:
        if self.shaping.overlong_cache >= self.rollout.max_new_tokens:
            raise ValueError(
                f"shaping.overlong_cache: must be < rollout.max_new_tokens ({self.rollout.max_new_tokens}), "
                f"got {self.shaping.overlong_cache}"
            )
        if self.rollout.prompts_per_iter * self.rollout.group_size < self.optim.minibatches:
            raise ValueError("optim.minibatches: more minibatches than responses per iteration")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts (task arguments included), as ``config.yaml`` holds them."""
        return self.model_dump(mode="python")

    def dump(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    def updated(self, changes: Mapping[str, Mapping[str, Any]]) -> Config:
        """A new, validated config with ``{section: {key: value}}`` replaced (this one is frozen)."""
        data = self.to_dict()
        for section, values in changes.items():
            data[section] = {**data[section], **values}
        return validated(Config, data)


SECTIONS = tuple(Config.model_fields)
