"""The typed configuration: one dataclass per component, one documented default per field.

Sections mirror the data flow of an RL iteration (DESIGN.md): rollout -> reward (+ shaping,
hybrid) -> value -> credit -> loss -> optim. Loading and validation live in
:mod:`creditrl.config.loader` and :mod:`creditrl.config.validate`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration problem; the message names the key and what was expected."""


@dataclass
class PolicyConfig:
    model: str = "tiny"  # "tiny" (built locally) or a local save_pretrained directory
    init_seed: int = 0  # seed of the tiny model's random initialisation
    engine: str = "auto"  # generation engine: static | hf | auto (static when the architecture allows) | vllm (CUDA; vLLM installed separately)
    kernels: str = "auto"  # static engine decode step: numba (compiled kernels) | torch (tensor ops) | auto (numba in fp32 when importable)
    dtype: str = "float32"  # weights: float32 | bfloat16 | float16
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (CUDA when torch sees a GPU): policy, reference and critic
    precision: str = "fp32"  # fp32 | bf16 | fp16: autocast mixed precision of every forward pass (weights stay in dtype)
    local_files_only: bool = True  # hub names from the local HF cache only; false allows downloads
    chat_template: str = "auto"  # auto: render prompts through the tokenizer's chat template if it has one; none
    lora_r: int = 0  # RL policy: LoRA rank (0 = full fine-tuning); the SFT warm start is always full
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: str = "q_proj,k_proj,v_proj,o_proj"  # comma-separated module names
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (RL update)


@dataclass
class TaskConfig:
    name: str = "arithmetic"  # a registered task
    args: dict[str, Any] = field(default_factory=lambda: {"min_ops": 4, "max_ops": 6})  # task constructor kwargs


@dataclass
class SFTConfig:
    steps: int = 1500  # optimizer steps of supervised warm start
    batch_size: int = 64  # problems per step
    lr: float = 2e-3  # peak learning rate (linear warm-up, cosine decay)
    warmup_steps: int = 100
    weight_decay: float = 0.01
    task_args: dict[str, Any] = field(default_factory=lambda: {"min_ops": 1, "max_ops": 6})  # SFT problem mix ({} = task.args); reset when task.name changes
    seed: int = 0


@dataclass
class RolloutConfig:
    prompts_per_iter: int = 16  # distinct prompts per RL iteration
    group_size: int = 8  # samples per prompt (G)
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class RewardConfig:
    source: str = "outcome"  # a registered reward source: outcome | oracle_steps
    granularity: str = ""  # sequence | step | segment | token | key_token; "" = the source's default
    on_error: str = "raise"  # raise | zero | skip: what a failing or NaN reward does
    step_separator: str | None = None  # step granularity and step structure; None = the task's
    cut_fn: str | None = None  # "module:function" cutting step/segment spans (token texts -> end indices)
    segment_tokens: int = 8  # K of fixed K-token segments
    key_after: str = "="  # key_token: a token is key when the previous token's text ends with this
    key_fn: str | None = None  # "module:function" key-token predicate (token texts, index) -> bool
    prm: str | None = None  # a trained PRM directory (creditrl prm train), read by the `prm` source


@dataclass
class ShapingConfig:
    length_budget: int = 0  # tokens allowed before the length penalty starts
    length_coef: float = 0.0  # penalty per token past the budget; 0 disables
    overlong_cache: int = 0  # DAPO soft overlong buffer before rollout.max_new_tokens; 0 disables
    overlong_coef: float = 1.0
    kl_coef: float = 0.0  # beta of the KL-in-reward term -beta*KL_t; 0 disables
    kl_estimator: str = "k1"


@dataclass
class HybridConfig:
    filter: str = "none"  # none | top_q | group_accuracy: which responses reach the dense rewards
    filter_q: float = 0.5  # top_q: share of responses kept
    filter_lo: float = 0.2  # group_accuracy: keep groups whose accuracy lies in [lo, hi]
    filter_hi: float = 0.8
    dense_source: str = ""  # a second reward source mixed in as w_seq*reward + w_dense*dense
    dense_granularity: str = ""  # "" = the dense source's default
    schedule: str = "constant"  # constant | switch | linear: the mix weights over training
    switch_at: float = 0.8  # switch: share of training that is sequence-only
    dense_weight: float = 1.0
    calibrate: bool = False  # scale the dense weight by its running agreement with the outcome
    calibration_momentum: float = 0.9


@dataclass
class ValueConfig:
    source: str = "none"  # none | critic | dual_critic | mc | tree
    model: str = "separate"  # critic heads on a separate backbone or shared with the policy
    backbone: str = ""  # separate critic: "" = a copy of the initial policy, "tiny", or a local model path
    lr: float = 1e-4  # critic optimizer
    clip_eps: float | None = 0.2  # clipped value loss; None = plain squared error
    coef: float = 0.5  # weight of the value loss in the policy loss (shared critic)
    warmup_iterations: int = 0  # iterations that train only the critic
    mc_samples: int = 4  # mc: continuations per step boundary (K)
    tree_branching: int = 2  # tree: children per node (b)
    tree_depth: int = 3  # tree: levels of branching (D); group_size must be b ** D
    seed: int = 0  # critic head initialisation


@dataclass
class CreditConfig:
    estimator: str = "grpo"  # reinforce | reinforce_baseline | rloo | grpo | dr_grpo | grpo_process | gae
    normaliser: str = "none"  # none | batch | group (whitening after the estimator)
    gamma: float = 1.0
    lam: float = 1.0  # GAE lambda (at the first iteration when lam_end is set)
    lam_end: float | None = None  # linear lambda schedule lam -> lam_end over training
    resolution: str = "auto"  # token | step (one time step per reasoning step); auto = step for mc values


@dataclass
class LossConfig:
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # asymmetric upper clip (DAPO clip-higher); None = clip_eps
    dual_clip: float | None = None
    kl_coef: float = 0.0  # weight of KL(pi || pi_ref) as a loss term; 0 disables the reference model
    kl_estimator: str = "k3"
    aggregation: str = "token-mean"
    entropy_coef: float = 0.0
    recompute_logprobs: str = "auto"  # old-policy log-probs from the update's own forward: auto (when precision != fp32) | always | never


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | sgd (with momentum)
    lr: float = 5e-5
    beta1: float = 0.9  # adamw
    beta2: float = 0.99  # adamw
    eps: float = 1e-8  # adamw: a larger eps makes coordinates with tiny, noisy gradients move less than lr
    momentum: float = 0.9  # sgd (heavy-ball)
    warmup_iterations: int = 0  # linear lr warm-up; Adam's first steps are sign-like and noisy in RL
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ppo_epochs: int = 1  # passes over each batch
    minibatches: int = 1  # optimizer steps per pass
    micro_batch_positions: int = 4096  # gradient accumulation over groups up to this many padded positions; 0 = whole minibatch
    skip_zero_advantage: bool = True  # leave rows whose advantages are all 0 out of the forward/backward when that is exact (no KL, entropy or critic term)


@dataclass
class TrainConfig:
    iterations: int = 100
    eval_every: int = 10  # held-out greedy evaluation every N iterations (and at 0 and the end)
    eval_size: int = 256  # held-out problems per evaluation
    checkpoint_every: int = 50
    seed: int = 0
    max_tokens: int = 0  # stop once this many tokens were generated (0 = run all iterations)
    init: str = "sft"  # "sft" (cached warm start), "policy" (policy.model as is) or a checkpoint dir
    threads: int = 0  # torch intra-op threads; 0 = leave torch's default
    progress: bool = True
    inspect_every: int = 10  # save groups for `creditrl inspect` every N iterations (+ first, last); 0 = off
    inspect_groups: int = 2  # whole groups saved per recorded iteration (mixed outcomes first)


@dataclass
class PRMConfig:
    labeler: str = "oracle"  # oracle | outcome_heuristic | mc | vote (creditrl prm label)
    vote_labelers: str = "outcome_heuristic,mc"  # comma-separated labelers for vote
    vote_threshold: float = 1.0  # keep a voted label when this share of labelers agrees
    problems: int = 512  # problems whose policy samples are labelled
    samples: int = 4  # solutions per problem
    temperature: float = 1.0  # sampling temperature of those solutions
    split: str = "train"  # task split the problems come from
    mc_n: int = 8  # mc: continuations per step prefix (N)
    mc_mode: str = "hard"  # hard (any continuation correct) | soft (share correct)
    mc_temperature: float = 1.0  # sampling temperature of the MC completer
    completer: str = ""  # mc: checkpoint directory of the completer policy; "" = the policy being labelled
    mc_rows_per_call: int = 8192  # mc: continuations an engine holds at once (memory); the samples do not depend on it
    members: int = 1  # ensemble members (each a backbone + head)
    combine: str = "mean"  # mean | min over members
    likelihood: bool = True  # the head also reads the step's summed and minimum token log-probs
    train_backbone: bool = False  # True fine-tunes the backbone too (it overfitted at 2-8k examples here)
    steps: int = 600  # optimizer steps of PRM training
    batch_size: int = 32
    lr: float = 1e-2  # heads only by default; 1e-3 suits a fine-tuned backbone
    soft: bool = False  # train on soft labels (BCE toward the float) instead of hard ones
    augment_rate: float = 0.0  # share of all-correct examples copied with one corrupted step
    max_step_tokens: int | None = None  # drop training examples with a longer step (shortcut defence)
    seed: int = 0


@dataclass
class BackendConfig:
    name: str = "local"  # local (one process) | ray (rollout and scoring workers as Ray actors)
    rollout_workers: int = 2  # ray: generation actors; each holds a copy of the policy
    score_workers: int = 0  # ray: reward-scoring actors (0 = score on the driver)
    address: str = ""  # ray: "" starts a local Ray instance; "auto" or host:port joins a cluster
    worker_threads: int = 1  # ray: torch intra-op threads per actor
    max_restarts: int = 3  # ray: times a dead actor is replaced before the run fails
    learner: str = "ddp"  # torchrun launches: ddp (a full copy per rank) | fsdp (the update trains a sharded copy)


@dataclass
class Config:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    hybrid: HybridConfig = field(default_factory=HybridConfig)
    value: ValueConfig = field(default_factory=ValueConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    prm: PRMConfig = field(default_factory=PRMConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def dump(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


