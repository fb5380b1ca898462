"""How well each value source estimates the true step values (legacy finding F3).

    python -m studies.values [CONFIG] [--set KEY=VALUE ...] [--quick] [--out DIR]

On any task with reasoning steps (the config's; default: the packaged arith config,
:mod:`studies.common`) the true value of a state -- a prompt plus the first steps of a response --
is computable: V(s) = P(a continuation from s by the policy is correct), estimated by ``truth``
fresh continuations per state. The policy is the config's start policy (the arith config's SFT)
and stays fixed, so every estimator targets the same V.

The states: one tree per held-out problem (:func:`creditrl.values.tree.tree_rollout`, branching b,
depth D, the rollout temperature), and every *inner* node of it -- the prompt and each shared
prefix that ends at a step end (leaves are finished responses whose value is their own outcome).
Per state, the estimators:

- ``tree``: the mean outcome of the tree's leaves below the node (what ``value.source=tree`` uses);
- ``mc K=k``: the mean outcome of k fresh continuations (VinePPO's estimate, ``value.mc_samples``);
- ``critic`` / ``dual critic`` after n samples: the learned V(s_t) read before the state's next
  token, trained as in RL (gae returns, lam 0.95) on the fixed policy's samples: the trainer's
  critic warm-up (``value.warmup_iterations``) with no policy update.

Metrics: mean absolute error against the truth, and step-ranking accuracy over pairs of related
states whose true values differ by at least ``MIN_GAP`` -- a state and its child (did the step
raise or lower the value: the sign of its advantage) and two siblings (which of two alternative
next steps is better): the share ordered like the truth, a tie counting one half. The truth
itself is noisy: its mean standard error is reported.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from creditrl.config import config_hash, load_config
from creditrl.experiments.seeds import mean_ci95
from creditrl.policy.engines import SamplingParams
from creditrl.policy.tokenizer import decode_response, encode_problem
from creditrl.rollout.segment import step_stop_ids
from creditrl.train import stages
from creditrl.train.build import start_policy
from creditrl.train.rl import RLTrainer
from creditrl.values.tree import TreeShape
from studies.common import base_config, logger, parser, run, step_task, task_phrase

CHUNK = 2048  # continuations per engine call
MIN_GAP = 0.1  # sibling pairs whose true values differ by less are not ranked
CRITIC_SET = [
    "credit.estimator=gae",
    "credit.lam=0.95",
    "credit.normaliser=batch",
    "train.eval_every=1000000",
    "train.checkpoint_every=1000000",
    "train.inspect_every=0",
]
FULL = {"problems": 48, "truth": 128, "mc": [1, 3, 9], "branching": 2, "depth": 3, "critic_iterations": [10, 40]}
QUICK = {"problems": 3, "truth": 8, "mc": [1, 3], "branching": 2, "depth": 2, "critic_iterations": [1, 2]}


@dataclass
class State:
    problem: int  # index into the problems
    node: int  # the tree's node id
    parent: int  # -1 for a root
    depth: int  # 0 = the prompt
    prefix: list[int]  # response tokens of the state
    row: int  # a leaf row under the node (the critic reads it at position len(prefix))
    tree_value: float


@dataclass
class EstimatorRow:
    arm: str  # the estimator
    mae: tuple[float, float]  # mean over states, 95% half-width
    rank_acc: float  # sibling pairs ordered like the truth
    pairs: int
    states: int
    tokens_per_state: float  # generated tokens the estimate cost per state (critic: its training samples' tokens)


def arm_names(sizes: dict[str, Any], samples_per_iteration: int) -> list[str]:
    """The report's rows in order, for ``sizes`` (FULL or QUICK) and the config's prompts x G."""
    return (
        [f"tree (b={sizes['branching']}, D={sizes['depth']})"]
        + [f"mc K={k}" for k in sizes["mc"]]
        + [
            f"{kind} ({it * samples_per_iteration:,} samples)"
            for kind in ("critic", "dual critic")
            for it in sizes["critic_iterations"]
        ]
    )


def inner_states(
    paths: list[list[int]],
    segment_ends: list[list[int]],
    tokens: list[list[int]],
    problem_of: list[int],
    outcomes: list[float],
) -> list[State]:
    """Every node of the trees that has children, with its prefix and tree value."""
    leaves_below: dict[int, list[float]] = {}
    info: dict[int, tuple[int, int, int, list[int], int]] = {}
    for row, (path, ends) in enumerate(zip(paths, segment_ends)):
        for n in path:
            leaves_below.setdefault(n, []).append(outcomes[row])
        for d, n in enumerate(path[:-1]):  # inner nodes only: each has the next node of the path below it
            prefix = tokens[row][: ends[d - 1] + 1] if d else []
            info.setdefault(n, (problem_of[row], path[d - 1] if d else -1, d, prefix, row))
    return [
        State(p, n, parent, d, prefix, row, float(np.mean(leaves_below[n])))
        for n, (p, parent, d, prefix, row) in sorted(info.items())
    ]


def continuation_outcomes(
    engine, tokenizer, task, problems, prompts, states: list[State], n: int, params: SamplingParams, seed: int
) -> tuple[list[list[float]], int]:
    """``n`` continuations of every state by the policy: their outcomes, and the tokens generated.
    The engine is called on chunks of at most ``CHUNK`` continuations (its KV cache is per row)."""
    gen_ = torch.Generator().manual_seed(seed)
    out: list[list[float]] = [[] for _ in states]
    spent = 0
    per_call = max(1, CHUNK // n)
    for lo in range(0, len(states), per_call):
        chunk = states[lo : lo + per_call]
        gen = engine.generate(
            [prompts[s.problem] + s.prefix for s in chunk],
            n,
            params,
            generator=gen_,
            budgets=[max(1, params.max_new_tokens - len(s.prefix)) for s in chunk],
        )
        for i, toks in zip(gen.prompt_index, gen.tokens):
            s = chunk[i]
            text = decode_response(tokenizer, s.prefix + list(toks))
            out[lo + i].append(float(task.check_outcome(problems[s.problem], text)))
        spent += sum(len(t) for t in gen.tokens)
    return out, spent


def related_pairs(states: list[State]) -> list[tuple[int, int]]:
    """Index pairs (i, j) of states one step apart (j is a child of i: the sign of the step's
    advantage) or alternatives (siblings: which next step is better)."""
    index = {(s.problem, s.node): i for i, s in enumerate(states)}
    kids: dict[int, list[int]] = {}
    pairs = []
    for j, s in enumerate(states):
        if s.parent >= 0:
            i = index[(s.problem, s.parent)]
            pairs.append((i, j))
            kids.setdefault(i, []).append(j)
    for group in kids.values():
        pairs += [(a, b) for k, a in enumerate(group) for b in group[k + 1 :]]
    return pairs


def step_rank_accuracy(states: list[State], truth: list[float], est: list[float]) -> tuple[float, int]:
    """Share of :func:`related_pairs` whose true values differ by at least ``MIN_GAP`` that the
    estimate orders like the truth (a tie counts one half); and how many pairs that was."""
    hits, n = 0.0, 0
    for i, j in related_pairs(states):
        if abs(truth[i] - truth[j]) < MIN_GAP:
            continue
        n += 1
        d = est[i] - est[j]
        hits += 0.5 if d == 0 else float((d > 0) == (truth[i] > truth[j]))
    return (hits / n if n else float("nan")), n


def score(arm: str, states: list[State], truth: list[float], est: list[float], tokens_per_state: float) -> EstimatorRow:
    err = [abs(e - t) for e, t in zip(est, truth)]
    acc, pairs = step_rank_accuracy(states, truth, est)
    return EstimatorRow(arm, mean_ci95(err), acc, pairs, len(states), tokens_per_state)


def critic_estimates(trainer: RLTrainer, batch, states: list[State]) -> list[float]:
    out = trainer.parts.value_stage(batch, torch.zeros_like(batch.response_mask), torch.Generator())
    return [float(out.values[s.row, len(s.prefix)]) for s in states]


def _pct(x: float) -> str:
    return "–" if x != x else f"{100 * x:.1f}%"  # no pair to rank: nan


def results_markdown(rows: list[EstimatorRow], truth_se: float) -> str:
    head = (
        "| estimator | mean abs. error vs truth | step-ranking accuracy | pairs ranked | states "
        "| generated tokens per state |\n|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r.arm} | {r.mae[0]:.3f} ± {r.mae[1]:.3f} | {_pct(r.rank_acc)} | {r.pairs} | {r.states} "
        f"| {r.tokens_per_state:,.0f} |\n"
        for r in rows
    )
    return head + body + f"\nThe truth's own mean standard error per state: {truth_se:.3f}.\n"


def plot_rows(rows: list[EstimatorRow], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=120)
    names = [r.arm for r in rows]
    a.barh(names, [r.mae[0] for r in rows], xerr=[r.mae[1] for r in rows], color="C0")
    a.set_xlabel("mean absolute error vs true value")
    b.barh(names, [0.0 if r.rank_acc != r.rank_acc else 100 * r.rank_acc for r in rows], color="C1")
    b.axvline(50, color="grey", linestyle="--", linewidth=1)
    b.set_xlabel("step-ranking accuracy (%)")
    b.set_yticklabels([])
    for ax in (a, b):
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_value_report(
    out: Path,
    *,
    quick: bool = False,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Write ``out/results.md``, ``summary.json`` and ``plots/value_error.png``; a finished report
    (summary.json with the same settings) is read back, not rerun."""
    sizes = QUICK if quick else FULL
    out = Path(out)
    base = base_config(config, quick)
    overrides = list(overrides or [])
    cfg = load_config(base, overrides)
    step_task(cfg, "the value study")  # before anything is loaded: the report cuts responses into steps
    # the resolved config's hash, not the base's path: a report copied from another checkout is reused
    settings = {"base": str(base), "config": config_hash(cfg.to_dict()), "overrides": overrides, "seed": seed, **sizes}
    done = out / "summary.json"
    if done.exists():
        old = json.loads(done.read_text())
        if {k: v for k, v in old.get("settings", {}).items() if k != "base"} == {
            k: v for k, v in settings.items() if k != "base"
        }:
            return old
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    log = logger("studies.values")
    init = start_policy(cfg, progress=cfg.train.progress)
    shape = TreeShape(sizes["branching"], sizes["depth"])
    rows: list[EstimatorRow] = []
    truth: list[float] = []
    for kind in ("critic", "dual_critic"):
        its = sizes["critic_iterations"]
        tcfg = load_config(
            base,
            overrides
            + CRITIC_SET
            + [
                f"value.source={kind}",
                f"train.iterations={its[-1]}",
                f"value.warmup_iterations={its[-1]}",
                f"train.seed={seed}",
            ],
        )
        trainer = RLTrainer.from_config(tcfg, out / kind, init_path=init, overwrite=True)
        if not truth:  # the states and their true values, once, with the (fixed) policy of the first trainer
            task, tok, engine = trainer.parts.task, trainer.parts.tokenizer, trainer.parts.engine
            problems = task.sample(sizes["problems"], split="heldout", seed=seed + 777)
            params = SamplingParams(max_new_tokens=tcfg.rollout.max_new_tokens, temperature=tcfg.rollout.temperature)
            sep = tcfg.reward.step_separator or task.step_separator
            batch = stages.rollout(
                engine,
                tok,
                problems,
                shape.leaves,
                params,
                torch.Generator().manual_seed(seed),
                tree=shape,
                stop_ids=step_stop_ids(tok, sep),
            )
            outcomes = [
                float(task.check_outcome(p, c)) for p, c in zip(batch.extras["problems"], batch.extras["completions"])
            ]
            tokens = [batch.response_ids[b, : int(batch.response_lengths[b])].tolist() for b in range(batch.size)]
            problem_of = batch.group_ids.tolist()
            states = inner_states(
                batch.extras["tree_paths"], batch.extras["tree_segment_ends"], tokens, problem_of, outcomes
            )
            prompts = [encode_problem(tok, p) for p in problems]
            log(f"{len(problems)} trees, {len(states)} inner states; truth from {sizes['truth']} continuations each")
            t_out, _ = continuation_outcomes(
                engine, tok, task, problems, prompts, states, sizes["truth"], params, seed + 1
            )
            truth = [float(np.mean(o)) for o in t_out]
            truth_se = float(np.mean([np.sqrt(v * (1 - v) / max(1, sizes["truth"] - 1)) for v in truth]))
            tree_tokens = stages.generated_tokens(batch) / len(states)
            names = iter(arm_names(sizes, tcfg.rollout.prompts_per_iter * tcfg.rollout.group_size))
            rows.append(score(next(names), states, truth, [s.tree_value for s in states], tree_tokens))
            mc_out, mc_tokens = continuation_outcomes(
                engine, tok, task, problems, prompts, states, max(sizes["mc"]), params, seed + 2
            )
            for k in sizes["mc"]:
                rows.append(
                    score(
                        next(names),
                        states,
                        truth,
                        [float(np.mean(o[:k])) for o in mc_out],
                        mc_tokens * k / max(sizes["mc"]) / len(states),
                    )
                )
            log("tree and MC estimates done; fitting the critics")
        spent = 0
        for it in range(its[-1]):
            row = trainer.iteration(it)
            spent += row["tokens/generated"]
            if it + 1 in its:
                name = next(names)
                rows.append(score(name, states, truth, critic_estimates(trainer, batch, states), spent / len(states)))
                log(f"{name}: MAE {rows[-1].mae[0]:.3f}")
    table = results_markdown(rows, truth_se)
    title = (
        f"value estimates vs truth ({sizes['truth']} continuations) on {len(states)} states of "
        f"{len(problems)} held-out trees of {task_phrase(cfg)}"
    )
    plot_rows(rows, out / "plots" / "value_error.png", title)
    summary = {
        "settings": settings,
        "init": init,
        "truth_se": truth_se,
        "rows": [asdict(r) for r in rows],
        "wall_s": time.time() - start,
    }
    (out / "results.md").write_text(f"# value report\n\n{title}\n\n{table}\n![value error](plots/value_error.png)\n")
    done.write_text(json.dumps(summary, indent=2))
    print("\n" + table)
    log(f"results: {out / 'results.md'}")
    return summary


def main(args: argparse.Namespace) -> None:
    run_value_report(Path(args.out), quick=args.quick, config=args.config, overrides=args.set)


def cli(argv: list[str] | None = None) -> int:
    p = parser("values", __doc__, out="output directory (a finished study is read back)")
    p.set_defaults(out="runs/values")
    return run(main, p, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
