"""Test-time search methods compared at equal generated-token cost.

    python -m studies.search [CONFIG] [--set KEY=VALUE ...] [--quick] [--out DIR] [--results docs/results/search.md]
        [--prm DIR] [--orm DIR] [--problems N] [--temperature T]

On held-out problems of the config's task, any task with reasoning steps, searched from the
config's start policy (``train.init``), with the config's ``search`` settings as the base of every
method's (:mod:`studies.common`). The default config is the packaged arith config with harder
problems than its RL task, ``task.args={min_ops: 5, max_ops: 7}`` (operands 1-9; its SFT policy
was trained on 1-6 operations); those task settings apply only while neither a CONFIG nor a
``task.*`` override is given.

1. unless given, train a PRM on oracle step labels and an ORM on outcomes, from the start
   policy's weights, on its own samples of training-split problems (as :mod:`studies.prm`);
2. run greedy; best-of-N for N in ``bon_ns`` with ``prm_min``, ``orm`` and ``majority`` (sampled
   once at the largest N, the first N samples of each problem used for each N, so the curves are
   nested; majority votes on the task's answers, grouped by its ``same_answer``, or on whole
   completions for a task without ``extract_answer``, which the report says); PRM beam search at
   a few (W, E); MCTS with PRM leaf values and with ORM-judged
   rollouts at a few token budgets, and once with oracle-judged rollouts (an upper bound: it
   reads the answer key);
3. record accuracy against mean generated tokens per problem (every token the engine returned,
   discarded expansions and rollouts included), and write ``report.md``, ``summary.json`` and
   ``plots/search_budget.png``.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from creditrl.config import Config, SearchConfig, load_config
from creditrl.experiments.report import plt
from creditrl.policy.engines import SamplingParams, make_engine
from creditrl.policy.model import load_policy
from creditrl.prm.metrics import select
from creditrl.prm.pipeline import label_samples, sample_solutions
from creditrl.prm.source import load_prm
from creditrl.prm.train import train_prm_from_examples
from creditrl.search.methods import make_context, sample_candidates, search
from creditrl.tasks import Task
from creditrl.tasks.base import majority_note, same_answer
from creditrl.train.build import start_policy
from studies.common import (
    base_config,
    default_task_sets,
    logger,
    parser,
    publish_report,
    run,
    step_task,
    task_phrase,
)
from studies.prm import orm_examples

TITLE = "Test-time search: accuracy against generated tokens"

DEFAULT_TASK = ["task.args={min_ops: 5, max_ops: 7}"]  # the default config's search problems (module docstring)


@dataclass(frozen=True)
class Sizes:
    problems: int = 128  # held-out problems every method is measured on
    prm_problems: int = 256  # training-split problems x prm_samples policy samples for PRM / ORM data
    prm_samples: int = 4
    prm_steps: int = 600
    bon_ns: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    beams: tuple[tuple[int, int], ...] = ((1, 4), (2, 4), (4, 4))  # (width W, expansions E)
    beam_budget: int = 4096  # high enough not to bind: beam cost is set by W and E
    mcts_prm_budgets: tuple[int, ...] = (256, 512, 1024)
    mcts_rollout_budgets: tuple[int, ...] = (512, 1024, 2048)
    oracle_budget: int = 1024  # mcts rollout_oracle (upper bound), one budget


QUICK = Sizes(
    problems=4,
    prm_problems=6,
    prm_samples=2,
    prm_steps=3,
    bon_ns=(1, 2, 4),
    beams=((1, 2), (2, 2)),
    beam_budget=512,
    mcts_prm_budgets=(128, 256),
    mcts_rollout_budgets=(256,),
    oracle_budget=256,
)


def _train_models(
    cfg: Config, init: str, policy, tok, task: Task, sizes: Sizes, out: Path, need: list[str], log
) -> None:
    """Train the PRM (oracle step labels) and/or ORM (outcomes) named in ``need`` into ``out/<name>``."""
    problems = task.sample(sizes.prm_problems, split="train", seed=0)
    params = SamplingParams(max_new_tokens=cfg.search.max_new_tokens, temperature=1.0)
    chunk = max(1, 1024 // sizes.prm_samples)  # bounds the KV cache of one generate call
    samples = [
        s
        for i in range(0, len(problems), chunk)
        for s in sample_solutions(
            policy, tok, task, problems[i : i + chunk], samples=sizes.prm_samples, params=params, seed=i
        )
    ]
    log(f"sampled {len(samples)} training solutions ({sum(s.outcome for s in samples)} correct)")
    data = {"prm": label_samples(samples, "oracle", task=task)[0], "orm": orm_examples(samples)}
    prm_cfg = cfg.updated({"prm": {"steps": sizes.prm_steps, "augment_rate": 0.0}})
    for name in need:
        log(f"training the {name.upper()} ({sizes.prm_steps} steps on {len(data[name])} examples)")
        train_prm_from_examples(prm_cfg, init, data[name], out / name, progress=cfg.train.progress)


def _best_of_n_rows(ctx, ns) -> list[dict[str, Any]]:
    """Accuracy and mean tokens of best-of-N for every N and selector, from one sampling at max N;
    majority groups answers by the task's ``same_answer``."""
    groups = sample_candidates(ctx, max(ns), prm=True, orm=True)
    same = functools.partial(same_answer, ctx.verify.task)
    rows = []
    for selector in ("prm_min", "orm", "majority"):
        for n in ns:
            firsts = [g[:n] for g in groups]
            picks = [g[select(selector, [s.candidate for s in g], same=same)] for g in firsts]
            rows.append(
                {
                    "series": f"best-of-N {selector}",
                    "method": "best_of_n",
                    "setting": f"N={n} selector={selector}",
                    "accuracy": sum(s.candidate.correct for s in picks) / len(picks),
                    "tokens_per_problem": sum(len(s.tokens) for g in firsts for s in g) / len(firsts),
                }
            )
    return rows


def report_configs(config: str | Path | None, overrides: list[str], quick: bool) -> tuple[Config, Config]:
    """``(policy config, search config)``: the start policy comes from the config as given, the
    problems from it with the report's default task settings (:data:`DEFAULT_TASK`, the default
    config only), so the default searches the arith config's SFT policy on harder problems."""
    base = base_config(config, quick)
    searched = default_task_sets(config, overrides, DEFAULT_TASK) + overrides
    return load_config(base, overrides), load_config(base, searched)


def run_search_report(
    out_dir: Path | None,
    *,
    quick: bool = False,
    config: str | Path | None = None,
    prm_dir: str | None = None,
    orm_dir: str | None = None,
    problems: int | None = None,
    overrides: list[str] | None = None,
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Every method on the config's task (module docstring); every method samples at ``temperature``
    (greedy aside), PRM/ORM data at temperature 1.

    Raises:
        ConfigError: Before anything is loaded, for a bad config or a task without reasoning steps.
    """
    sizes = QUICK if quick else Sizes()
    if problems is not None:
        sizes = replace(sizes, problems=problems)
    policy_cfg, cfg = report_configs(config, list(overrides or []), quick)
    task = step_task(cfg, "the search study")
    out_dir = Path(out_dir or Path("runs") / f"search-{time.strftime('%Y%m%d-%H%M%S')}")
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    start = time.time()
    log = logger("studies.search")
    init = start_policy(policy_cfg, progress=cfg.train.progress)
    policy, tok = load_policy(init)
    policy.eval()
    need = [name for name, given in (("prm", prm_dir), ("orm", orm_dir)) if given is None]
    if need:
        _train_models(cfg, init, policy, tok, task, sizes, out_dir / "prms", need, log)
    prm_dir, orm_dir = str(prm_dir or out_dir / "prms" / "prm"), str(orm_dir or out_dir / "prms" / "orm")
    held = task.sample(sizes.problems, split="heldout", seed=0)
    engine = make_engine(
        policy, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind=cfg.policy.engine, kernels=cfg.policy.kernels
    )
    log(f"{sizes.problems} held-out problems of {task_phrase(cfg)}, policy {init}")
    rows = _method_rows(
        held,
        cfg,
        sizes,
        temperature,
        log,
        engine=engine,
        tokenizer=tok,
        task=task,
        prm=load_prm(prm_dir),
        orm=load_prm(orm_dir),
    )
    summary = {
        "sizes": asdict(sizes),
        "task": {"name": cfg.task.name, "args": dict(cfg.task.args)},
        "policy": init,
        "prm": prm_dir,
        "orm": orm_dir,
        "temperature": temperature,
        "majority_note": majority_note(task),
        "rows": rows,
        "wall_s": time.time() - start,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot(rows, out_dir / "plots" / "search_budget.png", task_phrase(cfg))
    report = _report(summary, quick)
    (out_dir / "report.md").write_text(report)
    print(report)
    log(f"report: {out_dir / 'report.md'}")
    return summary


def _method_rows(held, cfg: Config, sizes: Sizes, temperature: float, log, **kw) -> list[dict[str, Any]]:
    """One row per method and setting (best-of-N: one per selector and N); every method's
    :class:`SearchConfig` is ``cfg.search`` with the method's settings replaced."""
    rows: list[dict[str, Any]] = []
    max_new = cfg.search.max_new_tokens

    def settings(**changes: Any) -> SearchConfig:
        return cfg.updated({"search": changes}).search

    def run(series: str, config: SearchConfig) -> None:
        result = search(held, config=config, **kw)
        rows.append({"series": series, **result.summary()})
        log(
            f"{series:28s} {config.describe():60s} acc {100 * result.accuracy:5.1f}%  "
            f"tokens/problem {result.tokens_mean:7.1f}  ({result.wall_s:.0f} s)"
        )

    run("greedy", settings(method="greedy", budget=max_new))
    t = time.time()
    bon_cfg = settings(
        method="best_of_n", n=max(sizes.bon_ns), budget=max(sizes.bon_ns) * max_new, temperature=temperature
    )
    rows += _best_of_n_rows(make_context(held, config=bon_cfg, **kw), sizes.bon_ns)
    log(f"best-of-N, N up to {max(sizes.bon_ns)} ({time.time() - t:.0f} s)")
    for width, expansions in sizes.beams:
        run(
            "beam (PRM)",
            settings(
                method="beam", width=width, expansions=expansions, budget=sizes.beam_budget, temperature=temperature
            ),
        )
    for budget in sizes.mcts_prm_budgets:
        run("mcts prm", settings(method="mcts", leaf_value="prm", budget=budget, temperature=temperature))
    for budget in sizes.mcts_rollout_budgets:
        run(
            "mcts rollout_orm",
            settings(method="mcts", leaf_value="rollout_orm", budget=budget, temperature=temperature),
        )
    run(
        "mcts rollout_oracle (upper bound)",
        settings(method="mcts", leaf_value="rollout_oracle", budget=sizes.oracle_budget, temperature=temperature),
    )
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | setting | accuracy | tokens/problem |", "|---|---|---|---|"]
    lines += [
        f"| {r['series']} | {r['setting'] or '-'}{' budget=' + str(r['budget']) if r['method'] == 'mcts' else ''} "
        f"| {100 * r['accuracy']:.1f}% | {r['tokens_per_problem']:.1f} |"
        for r in rows
    ]
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], path: Path, task: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = list(dict.fromkeys(r["series"] for r in rows))
    markers = "osD^v<>ph*"
    for i, name in enumerate(series):
        pts = sorted((r["tokens_per_problem"], 100 * r["accuracy"]) for r in rows if r["series"] == name)
        ax.plot(
            [max(x, 1e-1) for x, _ in pts],
            [y for _, y in pts],
            marker=markers[i % len(markers)],
            label=name,
            linestyle="--" if "upper bound" in name else "-",
        )
    ax.set_xscale("log")
    ax.set_xlabel("generated tokens per problem (log)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"test-time search on {task}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _report(s: dict[str, Any], quick: bool) -> str:
    note = "\n**Quick mode: smoke test only, the numbers mean nothing.**\n" if quick else ""
    args = ", ".join(f"{k}={v}" for k, v in s["task"]["args"].items())
    task = f"`{s['task']['name']}`" + (f" ({args})" if args else "")
    majority = f"\nMajority vote: {s['majority_note']}.\n" if s.get("majority_note") else ""
    return f"""# {TITLE}
{note}
Policy `{s["policy"]}`; {s["sizes"]["problems"]} held-out problems of task {task}. PRM `{s["prm"]}` (oracle step
labels), ORM `{s["orm"]}` (outcome labels). Tokens/problem: every token the engine generated for a problem
(discarded expansions and rollouts included), averaged over problems. Best-of-N: one sampling at the largest
N, the first N samples per problem for each N. MCTS `rollout_oracle` judges rollouts with the answer key: an
upper bound, not a test-time method. Sampling temperature {s.get("temperature", 1.0)} (greedy aside).
Wall time {s["wall_s"]:.0f} s.
{majority}
{markdown_table(s["rows"])}

![accuracy vs tokens](plots/search_budget.png)
"""


def main(args: argparse.Namespace) -> None:
    where = Path(args.out or Path("runs") / f"search-{time.strftime('%Y%m%d-%H%M%S')}")
    run_search_report(
        where,
        quick=args.quick,
        prm_dir=args.prm,
        orm_dir=args.orm,
        problems=args.problems,
        overrides=args.set,
        temperature=args.temperature,
        config=args.config,
    )
    publish_report(where / "report.md", args.results, TITLE)


def cli(argv: list[str] | None = None) -> int:
    p = parser(
        "search",
        __doc__,
        out="output directory (default runs/search-TIMESTAMP)",
        results="also write the report as a results page (e.g. docs/results/search.md)",
    )
    p.add_argument("--prm", help="use this PRM instead of training one on oracle step labels")
    p.add_argument("--orm", help="use this ORM instead of training one on outcomes")
    p.add_argument("--problems", type=int, default=None, help="held-out problems (default 128; quick: 4)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of every sampling method")
    return run(main, p, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
