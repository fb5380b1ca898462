"""The options of ``benchmarks/performance.py``: the model sizes, every section's sizes, the
targets the page holds the run to, and the quick variant."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import creditrl
from creditrl.policy.model import TinyPreset

NEVER_EOS = "<never-eos>"  # the appended eos of the random-init models: outside every model's vocabulary
CREDITRL_SRC = Path(creditrl.__file__).resolve().parents[1]  # .../src: PYTHONPATH of the current code's subprocesses
BENCHMARKS = Path(__file__).resolve().parent  # these scripts' folder, for the subprocesses that import them


@dataclass(frozen=True)
class Targets:
    """What the page holds a run to (each None: not a target). Arguments of the command, kept in the
    run's JSON, so a re-rendered page checks the same targets unless told others."""

    min_speedup: float | None = None  # creditrl's iteration vs TRL's, and its decode vs HF generate
    min_bandwidth_share: float | None = None  # the decode's bytes/s at the longest length vs the copy bandwidth
    min_peak_share: float | None = None  # the update's model FLOP/s vs the matmul peak
    min_baseline_speedup: float | None = None  # arith.yaml's samples/s end to end vs the baseline's
    max_rss_mb: float | None = None  # section e's peak RSS


@dataclass(frozen=True)
class ModelSize:
    """A Llama shape built by :func:`~creditrl.policy.model.build_tiny` (defaults: the tiny preset)."""

    name: str
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384

    def preset(self) -> TinyPreset:
        return TinyPreset(
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
        )


TINY = ModelSize("tiny")
SIZE_10M = ModelSize("10M", 384, 6, 6, 1024)
SIZE_50M = ModelSize("50M", 640, 10, 10, 1728)


@dataclass
class PerformanceOptions:
    """Every size of the benchmark (:func:`quick_options`: the seconds-long variant)."""

    policy: str = "sft"  # (a): "sft" (chain.yaml's cached SFT policy), "tiny" (random init, never-eos) or a dir
    lengths: tuple[int, ...] = (64, 256, 512, 1000)  # (a): generated tokens (1,000: n = 99, the SFT's longest chain)
    length_margin: int = 40  # (a): max_new_tokens = L + margin where the policy can stop (exactly L where not)
    prompts: int = 4
    group: int = 4
    temperature: float = 1.0  # TRL trains the tempered policy; at 1.0 both losses are the same
    lr: float = 5e-5
    skip_zero_advantage: bool = False  # False: creditrl trains every row, as TRL does (the same update work)
    rounds: int = 2  # creditrl and TRL alternate this many times per point
    iterations: int = 3  # iterations per trainer and round; the first of each dropped as warm-up
    repeats: int = 3  # decode calls per engine and point, alternating with HF generate
    sizes: tuple[ModelSize, ...] = (TINY, SIZE_10M, SIZE_50M)  # (b), random init
    size_length: int = 256  # (b): every row decodes exactly this many tokens
    study: tuple[str, ...] = ("arith", "chain")  # (c): packaged configs run by `creditrl train`
    study_iterations: dict[str, int] = field(default_factory=lambda: {"arith": 45, "chain": 10})
    study_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)  # extra --set per config
    baseline: Path | None = None  # (c): a checkout of the baseline's source: its arith.yaml vs the current code
    baseline_name: str = ""  # (c): the baseline's name on the page (default: the checkout folder's name)
    baseline_rounds: int = 2  # (old, new) pairs
    baseline_warmup: bool = True  # one untimed 1-iteration run of each code first (a fresh worktree compiles numba)
    copy_mb: int = 256  # (d)
    copy_repeats: int = 10
    matmul_n: int = 2048
    rss: bool = True  # (e)
    rss_size: ModelSize = SIZE_10M
    rss_prompts: int = 16
    rss_group: int = 8
    rss_tokens: int = 1024
    forward: tuple[str, ...] = ("arith", "chain")  # (f): packed vs HF forward on these configs' first batch
    forward_repeats: int = 3
    kl_skip: bool = True  # (f): what optim.skip_zero_advantage_kl changes, on arith.yaml
    kl_skip_iterations: int = 31
    kl_skip_at: tuple[int, ...] = (5, 15, 30)
    profile: bool = True  # (g): where the iteration's time goes, by stage and kind of work
    profile_warmup: int = 2  # (g): unprofiled iterations first (the first also warms the kernels)
    profile_iterations: int = 5
    trl: bool = True
    targets: Targets = field(default_factory=Targets)
    seed: int = 0
    out: Path = field(default_factory=lambda: Path("runs/bench"))
    results: Path | None = None


def quick_options(opts: PerformanceOptions) -> PerformanceOptions:
    """``opts`` at sizes where the whole command takes well under a minute (numbers meaningless)."""
    small = ("train.init=policy", "rollout.prompts_per_iter=2", "rollout.group_size=2", "train.eval_size=4")
    return replace(
        opts,
        policy="tiny" if opts.policy == "sft" else opts.policy,
        lengths=(8, 16),
        prompts=2,
        group=2,
        rounds=1,
        iterations=2,
        repeats=1,
        sizes=(ModelSize("0.1M", 64, 2, 2, 192), ModelSize("0.3M", 96, 3, 3, 256)),
        size_length=16,
        study_iterations={"arith": 3, "chain": 3},
        study_overrides={
            "arith": (*small, "rollout.max_new_tokens=8"),
            "chain": (*small, "rollout.max_new_tokens=16", "task.args={min_steps: 1, max_steps: 1}"),
        },
        baseline_rounds=1,
        baseline_warmup=False,
        copy_mb=8,
        copy_repeats=3,
        matmul_n=256,
        rss_size=ModelSize("0.1M", 64, 2, 2, 192),
        rss_prompts=2,
        rss_group=2,
        rss_tokens=32,
        forward_repeats=1,
        kl_skip_iterations=3,
        kl_skip_at=(1, 2),
        profile_warmup=1,
        profile_iterations=1,
    )
