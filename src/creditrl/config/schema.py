"""The typed configuration: the run's own sections (train, prm, backend, search) and the whole
:class:`Config`; the data-flow sections live in :mod:`.sections`, their building blocks in
:mod:`.types`. A field's ``description`` is its documentation: docs/config.md is generated from it
(:mod:`creditrl.config.reference`).

The schema checks types, ranges, closed choice sets (``Literal``) and the combinations that need
nothing but the config; registry names are checked, and ``auto`` / ``""`` / ``None`` defaults
resolved, when the run is built (:mod:`creditrl.train.build`). Every section is frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from creditrl.config.sections import (
    CreditConfig,
    HybridConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    RewardConfig,
    RolloutConfig,
    SFTConfig,
    ShapingConfig,
    TaskConfig,
    ValueConfig,
)
from creditrl.config.types import BackendName, LeafValue, Learner, SearchMethod, Section, Split
from creditrl.config.validation import validated


class TrainConfig(Section):
    iterations: int = Field(100, ge=0, description="RL iterations")
    eval_every: int = Field(
        10, gt=0, description="held-out greedy evaluation every N iterations (and at 0 and the end)"
    )
    eval_size: int = Field(256, gt=0, description="held-out problems per evaluation")
    checkpoint_every: int = Field(50, gt=0, description="checkpoint every N iterations (and at the end)")
    merge_lora: bool = Field(
        False,
        description="`RUN_DIR/final` (the trained policy, written at the end) with LoRA adapters merged into "
        "plain weights; else it holds the adapters (both load with `from_pretrained`)",
    )
    push_to_hub: str = Field(
        "",
        description="a hub repo id that `RUN_DIR/final` is uploaded to at the end (needs "
        "`policy.local_files_only=false`); empty: never",
    )
    seed: int = Field(0, description="seed of every iteration's prompts and samples")
    max_tokens: int = Field(0, ge=0, description="stop once this many tokens were generated; 0 = run all iterations")
    init: str = Field(
        "auto",
        description="the start policy: `sft` (the cached supervised warm start on the task's solutions), "
        "`policy` (`policy.model` as is) or a checkpoint directory; `auto` resolves to `sft` for the "
        "embedded `tiny` preset and to `policy` for any other model",
    )
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = torch's default")
    progress: bool = Field(
        True, description="progress: a bar on a terminal, one plain line per iteration when stdout is not one"
    )
    report_to: list[str] = Field(
        [],
        description="experiment trackers, as TRL's report_to: any of `tensorboard`, `wandb` (follows "
        "WANDB_MODE, e.g. offline), `mlflow`, `trackio` (their libraries: the `trackers` extra); [] or `none`: none",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to(cls, value: Any) -> Any:
        """TRL's forms too: one name, or several comma-separated."""
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip() and v.strip() != "none"]
        return value

    inspect_every: int = Field(
        10, ge=0, description="save groups for `creditrl inspect` every N iterations (+ first, last); 0 = off"
    )
    inspect_groups: int = Field(2, ge=0, description="whole groups saved per recorded iteration (mixed outcomes first)")
    log_completions: int = Field(
        0,
        ge=0,
        description="completions logged per iteration (the first row of each group, in group order) with "
        "their prompt, sequence reward and mean advantage, to `RUN_DIR/completions.jsonl` and to the trackers "
        "with tables (TensorBoard text, a wandb Table); 0 = off",
    )


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
    mc_positions_per_call: int = Field(
        1 << 20,
        gt=0,
        description="mc: cache positions (rows x (prefix + new tokens)) an engine holds at once (memory); "
        "the samples do not depend on it",
    )
    members: int = Field(1, gt=0, description="ensemble members (each a backbone + head)")
    combine: str = Field("mean", description="ensemble combination: `mean` or `min`")
    likelihood: bool = Field(True, description="the head also reads the step's summed and minimum token log-probs")
    train_backbone: bool = Field(
        False,
        description="also fine-tune the backbone (every layer, embeddings included); false: only the heads "
        "(and the likelihood-feature weights) train, on a frozen copy of the start policy",
    )
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
    seed: int | Literal["run"] = Field(
        0,
        description="seed of labelling (the sampled solutions, MC continuations, heuristic draws) and training "
        "(head initialisation, data order, augmentation); `run` = `train.seed`: one PRM per RL seed, each its "
        "own `reward.prm=auto` cache entry (the one of `prm.seed` set to that number)",
    )
    format: str = Field(
        "auto",
        description="how `reward.prm` / `search.prm` is read: `auto` (detected from its files), `creditrl` "
        "(`creditrl prm train`), or a public PRM: `math_shepherd`, `qwen_prm`, `rlhflow`",
    )

    @field_validator("seed", mode="before")
    @classmethod
    def _seed(cls, value: Any) -> Any:
        """One line for anything else (the union would name its first member's error)."""
        if value != "run" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"prm.seed: expected an integer or 'run', got {value!r}")
        return value


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

    @property
    def prm_seed(self) -> int:
        """``prm.seed`` as the number it stands for: ``run`` is ``train.seed``."""
        return self.train.seed if self.prm.seed == "run" else self.prm.seed

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
