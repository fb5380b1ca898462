"""The sections of the RL data flow, in its order: policy, task, sft, rollout, reward (+ shaping,
hybrid), value, credit, loss, optim. Each field's description is its documentation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from creditrl.config.types import (
    ChatTemplate,
    CriticModel,
    Dtype,
    Forward,
    FrozenArgs,
    Kernels,
    KLEstimator,
    OnError,
    Precision,
    Recompute,
    Resolution,
    Section,
)


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
        "KV cache, CPU), `compiled` (static KV cache, decode step compiled per shape bucket: CUDA graphs "
        "on CUDA), `hf` (any HF model), `vllm` (CUDA, vLLM installed separately); `auto` resolves to "
        "`compiled` on CUDA and `static` on the CPU when the architecture allows, else `hf`",
    )
    kernels: Kernels = Field(
        "auto",
        description="static engine decode step: `numba` (compiled kernels; from hidden size 256 its "
        "matrix products run through oneDNN on weights reordered once per call) or `torch` (tensor ops); "
        "`auto` resolves to `numba` in fp32 when numba imports",
    )
    forward: Forward = Field(
        "auto",
        description="the update's and the reference's response forward: `auto` runs the packed pass "
        "(each distinct prompt once, only real response tokens; float32 Llama-family models) where it "
        "applies, else the HF modules' pass; `hf` always the HF pass (same results to float rounding)",
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
        description="`template` renders prompts (one user turn, or the problem's conversation) "
        "through the tokenizer's chat template, `none` writes bos + prompt; "
        "`auto` resolves to `template` when the tokenizer has one",
    )
    lora_r: int = Field(
        0, ge=0, description="LoRA rank of the RL policy (0 = full fine-tuning; the SFT warm start is always full)"
    )
    lora_alpha: float = Field(16.0, description="LoRA alpha")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    lora_targets: str = Field(
        "all-linear",
        description="the modules LoRA adapts: `all-linear` (every linear layer but the output head, any "
        "architecture) or comma-separated module names (e.g. `q_proj,v_proj`, GPT-2's `c_attn`)",
    )
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
        description="a registered task: `arithmetic`, `chain`, `paths`, `math`, `code`, "
        "`toy_translate`, `toy_summarise`, or `module:Class`",
    )
    args: FrozenArgs = Field(
        default_factory=lambda: {"min_ops": 4, "max_ops": 6},
        description="keyword arguments of the task's constructor; `system_prompt` (any task) adds a system turn",
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
    scheduled_sampling: Literal["none", "linear", "inverse_sigmoid"] = Field(
        "none",
        description="feed the model's own previous token instead of the reference's, with a probability "
        "rising over SFT (Bengio et al. 2015); one extra forward per step",
    )
    ss_max: float = Field(0.25, ge=0, le=1, description="scheduled sampling: the probability at the end of SFT")
    ss_k: float = Field(
        0.0, ge=0, description="inverse_sigmoid: Bengio's k in steps; 0 = midpoint at half of `sft.steps`"
    )
    ss_greedy: bool = Field(False, description="scheduled sampling: the model's argmax token instead of a sample")


class RolloutConfig(Section):
    prompts_per_iter: int = Field(16, gt=0, description="distinct prompts per RL iteration")
    group_size: int = Field(8, gt=0, description="samples per prompt (G)")
    max_new_tokens: int = Field(64, gt=0, description="longest response")
    max_prompt_tokens: int = Field(
        0,
        ge=0,
        description="longest prompt in tokens: a longer one (a data file's row, any task's problem) is one error "
        "line naming its file and row, before any engine sees it; 0 = the policy's context "
        "(`max_position_embeddings`, else 32768)",
    )
    temperature: float = Field(1.0, ge=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling threshold")


class RewardConfig(Section):
    source: str = Field(
        "outcome",
        description="a registered reward source: `outcome`, `oracle_steps`, "
        "`step_format`, `prm`, `implicit_prm`, `bleu`, `chrf`, `rouge`, `unit_tests`; `module:function` or "
        "`path/to/file.py:function` (a TRL reward function, called once per batch); or `rm:PATH` (a saved "
        "sequence-classification reward model)",
    )
    sources: list[str] = Field(
        [],
        description="more sources (names, reward functions or `rm:PATH`), each at its own default granularity, "
        "added to `source`'s rewards; each one's mean is logged as `reward/by_source/<name>`",
    )
    weights: list[float] = Field(
        [], description="weights of `[source, *sources]` in the sum (empty: all 1), as TRL's reward_weights"
    )
    granularity: str = Field(
        "",
        description="where the reward lands: `sequence`, `step`, `segment`, `token`, "
        '`key_token`; `""` resolves to the source\'s default',
    )
    on_error: OnError = Field(
        "raise",
        description="what a failing, timed-out or non-finite user function (reward source, checker) does: "
        "`raise` (one line naming it), `zero` (the row gets 0), `skip` (the row leaves the batch)",
    )
    timeout_s: float = Field(
        30.0,
        ge=0,
        description="time limit of each call of a user function (checkers, reward sources): they run in a "
        "killable worker process, and a call over the limit is an error under `on_error`; 0 = no limit, in process",
    )
    step_separator: str | None = Field(
        None,
        description="text that ends a reasoning step, for any task (it replaces the task's own); null resolves "
        "to the task's separator",
    )
    cut_fn: str | None = Field(
        None, description="`module:function` cutting step/segment spans (token texts -> end indices)"
    )
    segment_tokens: int = Field(8, gt=0, description="K of fixed K-token segments")
    key_after: str = Field("=", description="key_token: a token is key when the previous token's text ends with this")
    key_fn: str | None = Field(None, description="`module:function` key-token predicate (token texts, index) -> bool")
    implicit_beta: float = Field(0.05, gt=0, description="implicit_prm: beta of the reward beta * log(pi_rm / pi_ref)")
    implicit_lr: float = Field(1e-4, gt=0, description="implicit_prm: learning rate of its online updates")
    implicit_steps: int = Field(1, ge=0, description="implicit_prm: updates on each iteration's outcomes")
    implicit_center: bool = Field(
        True,
        description="implicit_prm: subtract from each token's reward the mean token reward of the other "
        "responses to the same prompt (PRIME's leave-one-out baseline); false keeps the raw log-ratios",
    )
    prm: str | None = Field(
        None,
        description="a trained PRM directory (`creditrl prm train`) for the `prm` "
        "source; `auto` resolves to a PRM trained once on the start policy's samples and cached",
    )

    @model_validator(mode="after")
    def _weights(self) -> RewardConfig:
        if self.weights and len(self.weights) != 1 + len(self.sources):
            raise ValueError(
                f"reward.weights: {len(self.weights)} weights for {1 + len(self.sources)} sources "
                "(reward.source and reward.sources)"
            )
        return self


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
    warmup_iterations: int = Field(
        0,
        ge=0,
        description="the first iterations of `train.iterations` train only the critic, toward the run's own "
        "returns (lambda `credit.lam_critic`); for VC-PPO's value pretraining see `pretrain_iterations`",
    )
    pretrain_iterations: int = Field(
        0,
        ge=0,
        description="value pretraining (VC-PPO, arXiv 2503.01491): before RL, this many iterations sample from "
        "the start policy and train only the critic toward Monte-Carlo (lambda 1) returns; not counted in "
        "`train.iterations`, their samples count in `tokens/total`; iteration 0 logs `pretrain/explained_variance`",
    )
    mc_samples: int = Field(4, gt=0, description="mc: continuations per step boundary (K)")
    mc_rows_per_call: int = Field(
        8192,
        gt=0,
        description="mc: continuations an in-process engine holds at once (memory; vLLM pages its own cache); "
        "the samples do not depend on it",
    )
    mc_positions_per_call: int = Field(
        1 << 20,
        gt=0,
        description="mc: cache positions (rows x (state + new tokens)) an in-process engine holds at once "
        "(memory); the samples do not depend on it",
    )
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
    lam_critic: float | None = Field(
        None,
        ge=0,
        le=1,
        description="lambda of the critic's targets (returns), decoupled from the advantages' `lam` (VC-PPO "
        "arXiv 2503.01491 and VAPO arXiv 2504.05118 use 1.0); null = `lam` (and its schedule)",
    )
    lam_alpha: float = Field(
        0.0,
        ge=0,
        description="length-adaptive lambda of the advantages (VAPO, arXiv 2504.05118; 0.05 there): > 0 gives each "
        "response lambda = clamp(1 - 1/(lam_alpha * l), 0, 1), l its length in credit time steps (tokens, or "
        "steps at step resolution), in place of `lam`; 0 = off",
    )
    outcome_coef: float = Field(
        0.0,
        ge=0,
        description="weight w of a separate outcome term added to the advantages, w * (o_b - mean of the group's "
        "other outcomes) on every token (PURE's PRM+VR with `min_form` on `reward.source=prm`, arXiv 2504.15275; "
        "PRIME); 0 = off",
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
        description="gradient accumulation over micro-batches of up to this many padded positions "
        "(whole groups where they fit, else a group's rows in parts); 0 = whole minibatch",
    )
    inference_positions: int = Field(
        16384,
        ge=0,
        description="the no-gradient passes (reference log-probs, recomputed old log-probs) run in chunks "
        "of up to this many padded positions; 0 = one pass",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="leave rows whose advantages are all 0 out of the "
        "forward/backward when that is exact (no KL, entropy or critic term)",
    )
    skip_zero_advantage_kl: bool = Field(
        False,
        description="an approximation: also leave zero-advantage rows out when a KL term is on, "
        "dropping their KL gradient (the KL then regularises the trained rows only); "
        "`benchmarks/performance.py` measures its gradient, FINDINGS.md (KLSKIP-arith) its training",
    )
