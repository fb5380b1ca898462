"""``creditrl search report``: test-time search methods compared at equal generated-token cost.

On held-out 5-7-operation arithmetic problems (the arith config's SFT policy, operands 1-9, was trained on 1-6):

1. unless given, train a PRM on oracle step labels and an ORM on outcomes, from the SFT
   weights, on the policy's own samples of training-split problems (as ``creditrl prm report``);
2. run greedy; best-of-N for N in ``bon_ns`` with ``prm_min``, ``orm`` and ``majority`` (sampled
   once at the largest N, the first N samples of each problem used for each N, so the curves are
   nested); PRM beam search at a few (W, E); MCTS with PRM leaf values and with ORM-judged
   rollouts at a few token budgets, and once with oracle-judged rollouts (an upper bound: it
   reads the answer key);
3. record accuracy against mean generated tokens per problem (every token the engine returned,
   discarded expansions and rollouts included), and write ``report.md``, ``summary.json`` and
   ``plots/search_budget.png``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from creditrl.config import load_config
from creditrl.config.loader import arith_config_path
from creditrl.experiments.prm_report import orm_examples
from creditrl.experiments.report import plt
from creditrl.policy.engines import SamplingParams
from creditrl.policy.model import load_policy
from creditrl.policy.engines import make_engine
from creditrl.prm.train import train_prm_from_examples
from creditrl.prm.metrics import select
from creditrl.prm.pipeline import label_samples, sample_solutions
from creditrl.prm.source import load_prm
from creditrl.config import SearchConfig
from creditrl.search.methods import make_context, sample_candidates, search
from creditrl.tasks import make_task
from creditrl.train.build import start_policy

TASK_ARGS = {"min_ops": 5, "max_ops": 7}
MAX_NEW = SearchConfig().max_new_tokens


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


QUICK = Sizes(problems=4, prm_problems=6, prm_samples=2, prm_steps=3, bon_ns=(1, 2, 4), beams=((1, 2), (2, 2)),
              beam_budget=512, mcts_prm_budgets=(128, 256), mcts_rollout_budgets=(256,), oracle_budget=256)


def _train_models(cfg, init: str, policy, tok, task, sizes: Sizes, out: Path, need: list[str], log) -> None:
    """Train the PRM (oracle step labels) and/or ORM (outcomes) named in ``need`` into ``out/<name>``."""
    problems = task.sample(sizes.prm_problems, split="train", seed=0)
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0)
    chunk = max(1, 1024 // sizes.prm_samples)  # bounds the KV cache of one generate call
    samples = [s for i in range(0, len(problems), chunk)
               for s in sample_solutions(policy, tok, task, problems[i : i + chunk], samples=sizes.prm_samples,
                                         params=params, seed=i)]
    log(f"sampled {len(samples)} training solutions ({sum(s.outcome for s in samples)} correct)")
    data = {"prm": label_samples(samples, "oracle", task=task)[0], "orm": orm_examples(samples)}
    prm_cfg = cfg.updated({"prm": {"steps": sizes.prm_steps, "augment_rate": 0.0}})
    for name in need:
        log(f"training the {name.upper()} ({sizes.prm_steps} steps on {len(data[name])} examples)")
        train_prm_from_examples(prm_cfg, init, data[name], out / name, progress=cfg.train.progress)


def _best_of_n_rows(ctx, ns) -> list[dict[str, Any]]:
    """Accuracy and mean tokens of best-of-N for every N and selector, from one sampling at max N."""
    groups = sample_candidates(ctx, max(ns), prm=True, orm=True)
    rows = []
    for selector in ("prm_min", "orm", "majority"):
        for n in ns:
            firsts = [g[:n] for g in groups]
            picks = [g[select(selector, [s.candidate for s in g])] for g in firsts]
            rows.append({
                "series": f"best-of-N {selector}", "method": "best_of_n", "setting": f"N={n} selector={selector}",
                "accuracy": sum(s.candidate.correct for s in picks) / len(picks),
                "tokens_per_problem": sum(len(s.tokens) for g in firsts for s in g) / len(firsts),
            })
    return rows


def run_search_report(
    out_dir: Path | None, *, quick: bool = False, prm_dir: str | None = None, orm_dir: str | None = None,
    problems: int | None = None, overrides: list[str] | None = None, temperature: float = 1.0,
) -> dict[str, Any]:
    """Every method samples at ``temperature`` (greedy aside); PRM/ORM data at temperature 1."""
    sizes = QUICK if quick else Sizes()
    if problems is not None:
        sizes = replace(sizes, problems=problems)
    out_dir = Path(out_dir or Path("runs") / f"search-{time.strftime('%Y%m%d-%H%M%S')}")
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    cfg = load_config(arith_config_path(quick), overrides or [])
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    start = time.time()
    log = lambda msg: print(f"[creditrl search report] {time.time() - start:6.0f} s  {msg}", flush=True)  # noqa: E731
    init = start_policy(cfg, progress=cfg.train.progress)
    policy, tok = load_policy(init)
    policy.eval()
    task = make_task("arithmetic", **TASK_ARGS)
    need = [name for name, given in (("prm", prm_dir), ("orm", orm_dir)) if given is None]
    if need:
        _train_models(cfg, init, policy, tok, task, sizes, out_dir / "prms", need, log)
    prm = load_prm(str(prm_dir or out_dir / "prms" / "prm"))
    orm = load_prm(str(orm_dir or out_dir / "prms" / "orm"))
    held = task.sample(sizes.problems, split="heldout", seed=0)
    engine = make_engine(policy, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, kind=cfg.policy.engine,
                         kernels=cfg.policy.kernels)
    kw = dict(engine=engine, tokenizer=tok, task=task, prm=prm, orm=orm)

    rows: list[dict[str, Any]] = []

    def run(series: str, config: SearchConfig) -> None:
        result = search(held, config=config, **kw)
        rows.append({"series": series, **result.summary()})
        log(f"{series:28s} {config.describe():60s} acc {100 * result.accuracy:5.1f}%  "
            f"tokens/problem {result.tokens_mean:7.1f}  ({result.wall_s:.0f} s)")

    log(f"{sizes.problems} held-out problems ({TASK_ARGS['min_ops']}-{TASK_ARGS['max_ops']} ops), policy {init}")
    run("greedy", SearchConfig(method="greedy", budget=MAX_NEW))
    t = time.time()
    bon_cfg = SearchConfig(method="best_of_n", n=max(sizes.bon_ns), budget=max(sizes.bon_ns) * MAX_NEW,
                           temperature=temperature)
    rows += _best_of_n_rows(make_context(held, config=bon_cfg, **kw), sizes.bon_ns)
    log(f"best-of-N, N up to {max(sizes.bon_ns)} ({time.time() - t:.0f} s)")
    for width, expansions in sizes.beams:
        run("beam (PRM)", SearchConfig(method="beam", width=width, expansions=expansions, budget=sizes.beam_budget,
                                       temperature=temperature))
    for budget in sizes.mcts_prm_budgets:
        run("mcts prm", SearchConfig(method="mcts", leaf_value="prm", budget=budget, temperature=temperature))
    for budget in sizes.mcts_rollout_budgets:
        run("mcts rollout_orm", SearchConfig(method="mcts", leaf_value="rollout_orm", budget=budget,
                                             temperature=temperature))
    run("mcts rollout_oracle (upper bound)", SearchConfig(method="mcts", leaf_value="rollout_oracle",
                                                          budget=sizes.oracle_budget, temperature=temperature))

    summary = {"sizes": asdict(sizes), "task": TASK_ARGS, "policy": init, "prm": str(prm_dir or out_dir / "prms" / "prm"),
               "orm": str(orm_dir or out_dir / "prms" / "orm"), "temperature": temperature, "rows": rows,
               "wall_s": time.time() - start}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot(rows, out_dir / "plots" / "search_budget.png")
    report = _report(summary, quick)
    (out_dir / "report.md").write_text(report)
    print(report)
    log(f"report: {out_dir / 'report.md'}")
    return summary


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | setting | accuracy | tokens/problem |", "|---|---|---|---|"]
    lines += [f"| {r['series']} | {r['setting'] or '-'}{' budget=' + str(r['budget']) if r['method'] == 'mcts' else ''} "
              f"| {100 * r['accuracy']:.1f}% | {r['tokens_per_problem']:.1f} |" for r in rows]
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = list(dict.fromkeys(r["series"] for r in rows))
    markers = "osD^v<>ph*"
    for i, name in enumerate(series):
        pts = sorted((r["tokens_per_problem"], 100 * r["accuracy"]) for r in rows if r["series"] == name)
        ax.plot([max(x, 1e-1) for x, _ in pts], [y for _, y in pts], marker=markers[i % len(markers)], label=name,
                linestyle="--" if "upper bound" in name else "-")
    ax.set_xscale("log")
    ax.set_xlabel("generated tokens per problem (log)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"test-time search on arithmetic ({TASK_ARGS['min_ops']}-{TASK_ARGS['max_ops']} operations)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _report(s: dict[str, Any], quick: bool) -> str:
    note = "\n**Quick mode: smoke test only, the numbers mean nothing.**\n" if quick else ""
    return f"""# creditrl search report
{note}
Policy `{s['policy']}` (the arith config's SFT policy, trained on 1-6 operations); {s['sizes']['problems']} held-out
arithmetic problems with {s['task']['min_ops']}-{s['task']['max_ops']} operations. PRM `{s['prm']}` (oracle step
labels), ORM `{s['orm']}` (outcome labels). Tokens/problem: every token the engine generated for a problem
(discarded expansions and rollouts included), averaged over problems. Best-of-N: one sampling at the largest
N, the first N samples per problem for each N. MCTS `rollout_oracle` judges rollouts with the answer key: an
upper bound, not a test-time method. Sampling temperature {s.get('temperature', 1.0)} (greedy aside).
Wall time {s['wall_s']:.0f} s.

{markdown_table(s['rows'])}

![accuracy vs tokens](plots/search_budget.png)
"""
