"""The long-output setting's SFT start policy at several response lengths.

    python -m studies.long_outputs [CONFIG] [--set KEY=VALUE ...] [--quick] [--results docs/results/long_outputs.md]
        [--problems N] [--lengths N ...] [--temperature T]

The task is the chain task (:mod:`creditrl.tasks.chain`): prompts ``"31~040="``, ``n`` steps of
10 characters mod ``m`` (``modulus``, 5 by default), a response of ``10 n + 4`` characters and the
eos. The policy is the config's SFT warm start (:func:`creditrl.train.sft.cached_sft` of the
packaged ``chain`` config: one SFT on 1-99-step chains serves every length). Per chain length
(default ``n = 6, 25, 51, 99``, about 64, 256, 512 and 1,000 tokens), on held-out problems of the
length band around it (:func:`creditrl.tasks.chain.band`: ``n - 2 .. n + 2``), greedy (through
:func:`creditrl.train.evaluate.evaluate`) and sampled at the rollout temperature:

- mean generated tokens, and the share of responses that stopped (eos within the budget);
- per-step accuracy ``p``: the probability that a step is right given every earlier one was,
  ``sum_k / (sum_k + broken)`` over problems, where ``k`` is a solution's correct steps before its
  first error (the task's ``check_steps`` on ``split_completion``) and ``broken`` counts the
  solutions with fewer than ``n`` correct steps (a wrong step, or the next step missing: an early
  answer or a truncated response). It is the maximum-likelihood estimate of a constant per-step
  success probability from first-error positions censored at ``n``;
- ``p ** n``, the solution accuracy that a constant per-step accuracy predicts (averaged over the
  problems' lengths), next to the measured solution accuracy (the answer right, ``check_outcome``);
- where each solution first goes wrong (the task's ``first_error``).

At one length there are only ``m^2`` prompts (25 for modulus 5), about a tenth of them held out:
two or three, or none. So each row draws from the five lengths ``n - 2 .. n + 2`` (``5 m^2`` = 125
prompts, a dozen held out), and its ``N`` held-out draws repeat those; the page gives the distinct
prompts per row. Greedy decoding runs once per distinct prompt and counts each by its number of
draws (what evaluating all ``N`` gives).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from creditrl.config import Config, load_config
from creditrl.config.loader import packaged_config
from creditrl.errors import ConfigError
from creditrl.policy.device import resolve_device
from creditrl.policy.engines import SamplingParams, make_engine
from creditrl.policy.model import load_policy, policy_options
from creditrl.policy.tokenizer import decode_response, encode_problem
from creditrl.tasks.arithmetic import split_completion
from creditrl.tasks.base import Problem
from creditrl.tasks.chain import BAND, MAX_STEPS, ChainTask, band, sft_longest
from creditrl.train.evaluate import evaluate
from creditrl.train.resolve import build_task
from creditrl.train.sft import cached_sft
from studies.common import parser, run, write_results

LENGTHS = (6, 25, 51, 99)  # ~64, 256, 512, 1,000 generated tokens
PROBLEMS = 256
SEED = 0
# --quick: a 20-step SFT on short chains, two short lengths (numbers meaningless)
QUICK_SETS = [
    "sft.steps=20",
    "sft.batch_size=4",
    "sft.warmup_steps=2",
    "sft.task_args={min_steps: 1, max_steps: 4}",
    "train.eval_size=4",
    "rollout.max_new_tokens=48",
]
QUICK_LENGTHS = (2, 4)
QUICK_PROBLEMS = 8


def budget(n: int) -> int:
    """``max_new_tokens`` at chain length ``n``: the response (``10 n + 4``) and some room past it
    for the eos and more (``max(16, n)``): 565 tokens at ``n = 51``, near the chain config's 600
    at its longest RL chain, 56."""
    return 10 * n + 4 + max(16, n)


def step_counts(task: ChainTask, problem: Problem, completion: str) -> tuple[int, bool]:
    """``(k, broken)``: the correct steps of ``completion`` before its first error, and whether it
    has fewer than the problem's ``n`` (a wrong step, or the next one missing)."""
    segments = split_completion(completion)
    labels = task.check_steps(problem, segments)
    k = sum(label for segment, label in zip(segments, labels) if not segment.strip().startswith("#"))
    return k, k < problem.meta["n_ops"]


def per_step_accuracy(counts: Sequence[tuple[int, bool]]) -> float:
    """``sum k / (sum k + #broken)`` over ``(k, broken)`` pairs (see :func:`step_counts`): the
    probability that a step is right given every earlier one was; nan without any step."""
    right = sum(k for k, _ in counts)
    broken = sum(bool(b) for _, b in counts)
    return right / (right + broken) if right + broken else float("nan")


@dataclass
class DecodeStats:
    """One decoding's results at one length, every problem counted by its weight."""

    n: int  # the row's chain length (the middle of its band)
    problems: int
    mean_tokens: float
    stopped: float  # share that ended with eos within the budget
    per_step: float
    accuracy: float  # share with the right answer
    errors: dict[str, int] = field(default_factory=dict)  # first_error kind -> problems
    lengths: dict[int, int] = field(default_factory=dict)  # chain length -> problems

    @property
    def predicted(self) -> float:
        """The solution accuracy a constant per-step accuracy predicts: ``per_step ** n_i``
        averaged over the problems' lengths ``n_i``."""
        total = sum(self.lengths.values())
        if not total:
            return self.per_step**self.n
        return sum(w * self.per_step**k for k, w in self.lengths.items()) / total


def decode_stats(
    task: ChainTask,
    problems: Sequence[Problem],
    completions: Sequence[str],
    tokens: Sequence[int],
    stopped: Sequence[bool],
    weights: Sequence[int] | None = None,
    n: int | None = None,
) -> DecodeStats:
    """The statistics of ``completions`` (generated ``tokens`` each; ``stopped``: ended by eos) of
    ``problems`` of one row, problem ``i`` counted ``weights[i]`` times (default once); ``n``: the
    row's length (default the problems' mean length, rounded)."""
    weights = list(weights) if weights is not None else [1] * len(problems)
    total = sum(weights)
    counts, solved, errors, lengths = [], 0, Counter(), Counter()
    for p, c, w in zip(problems, completions, weights):
        counts += [step_counts(task, p, c)] * w
        solved += w * task.check_outcome(p, c)
        errors[task.first_error(p, c)] += w
        lengths[p.meta["n_ops"]] += w
    if n is None:
        n = round(sum(k * w for k, w in lengths.items()) / total)
    return DecodeStats(
        n=n,
        problems=total,
        mean_tokens=sum(t * w for t, w in zip(tokens, weights)) / total,
        stopped=sum(s * w for s, w in zip(stopped, weights)) / total,
        per_step=per_step_accuracy(counts),
        accuracy=solved / total,
        errors={kind: errors.get(kind, 0) for kind in task.error_kinds},
        lengths=dict(sorted(lengths.items())),
    )


def greedy_stats(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: ChainTask,
    problems: list[Problem],
    cfg: Config,
    n: int,
    limit: int,
) -> DecodeStats:
    """Greedy decoding (``limit`` new tokens) through :func:`~creditrl.train.evaluate.evaluate`,
    once per distinct prompt, of the problems of row ``n``."""
    draws = Counter(p.prompt for p in problems)
    distinct = list({p.prompt: p for p in problems}.values())
    res = evaluate(
        model,
        tokenizer,
        task,
        distinct,
        max_new_tokens=limit,
        engine=cfg.policy.engine,
        precision=cfg.policy.precision,
        kernels=cfg.policy.kernels,
    )
    # evaluate returns text: the tokens are those of the text, plus the eos of a response that stopped
    text_tokens = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in res.completions]
    stopped = [t < limit for t in text_tokens]
    tokens = [t + s for t, s in zip(text_tokens, stopped)]
    return decode_stats(task, distinct, res.completions, tokens, stopped, [draws[p.prompt] for p in distinct], n)


def sampled_stats(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: ChainTask,
    problems: list[Problem],
    cfg: Config,
    temperature: float,
    seed: int,
    n: int,
    limit: int,
) -> DecodeStats:
    """One sample per problem of row ``n`` at ``temperature`` (``limit`` new tokens) from the fast engine."""
    engine = make_engine(
        model,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        kind=cfg.policy.engine,
        precision=cfg.policy.precision,
        kernels=cfg.policy.kernels,
    )
    params = SamplingParams(max_new_tokens=limit, temperature=temperature)
    gen = engine.generate(
        [encode_problem(tokenizer, p) for p in problems], 1, params, generator=torch.Generator().manual_seed(seed)
    )
    completions = [decode_response(tokenizer, t) for t in gen.tokens]
    return decode_stats(task, problems, completions, [len(t) for t in gen.tokens], gen.finished, n=n)


@dataclass
class LengthRow:
    n: int
    lengths: tuple[int, int]  # the band: shortest and longest chain
    budget: int  # max_new_tokens: budget() of the band's longest chain
    distinct: int  # distinct prompts among the draws
    greedy: DecodeStats
    sampled: DecodeStats
    wall_s: float


def length_task(cfg: Config, n: int) -> ChainTask:
    """The config's chain task with its chains in row ``n``'s :func:`band`."""
    if cfg.task.name != "chain":
        raise ConfigError(f"task.name: the long-output study needs the chain task, got '{cfg.task.name}'")
    if not 1 <= n <= MAX_STEPS:
        raise ConfigError(f"lengths: a chain length must lie in [1, {MAX_STEPS}], got {n}")
    lo, hi = band(n, sft_longest(cfg))
    return build_task(cfg.task.name, {**cfg.task.args, "min_steps": lo, "max_steps": hi})  # type: ignore[return-value]


def measure(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: Config,
    *,
    lengths: Sequence[int] = LENGTHS,
    problems: int = PROBLEMS,
    temperature: float | None = None,
    seed: int = SEED,
    log: bool = True,
) -> list[LengthRow]:
    """Greedy and sampled statistics of ``model`` per chain length ``n``, on held-out problems of
    ``n - 2 .. n + 2`` steps (``temperature``: default the config's rollout temperature)."""
    temperature = cfg.rollout.temperature if temperature is None else temperature
    rows = []
    for n in lengths:
        start = time.time()
        task = length_task(cfg, n)
        lengths = band(n, sft_longest(cfg))
        limit = budget(lengths[1])
        drawn = task.sample(problems, split="heldout", seed=seed)
        greedy = greedy_stats(model, tokenizer, task, drawn, cfg, n, limit)
        sampled = sampled_stats(model, tokenizer, task, drawn, cfg, temperature, seed, n, limit)
        row = LengthRow(n, lengths, limit, len({p.prompt for p in drawn}), greedy, sampled, time.time() - start)
        rows.append(row)
        if log:
            print(
                f"n={n:>4} ({lengths[0]}-{lengths[1]} steps, {row.distinct} prompts): per-step "
                f"{greedy.per_step:.4f} / {sampled.per_step:.4f}, solutions {greedy.accuracy:.3f} / "
                f"{sampled.accuracy:.3f} (greedy / sampled), {row.wall_s:.0f} s",
                flush=True,
            )
    return rows


def _mean_length(stats: DecodeStats) -> float:
    total = sum(stats.lengths.values())
    return sum(k * w for k, w in stats.lengths.items()) / total if total else float(stats.n)


def _pair(a: float, b: float, fmt: str) -> str:
    return f"{a:{fmt}} / {b:{fmt}}"


def render(rows: Sequence[LengthRow], cfg: Config, sft: dict, temperature: float, problems: int) -> str:
    """The page body: setting, SFT recipe, the table per length and the first errors."""
    s, knobs = cfg.sft, ChainTask(**dict(cfg.task.args)).config
    sft_args = ", ".join(f"{k}={v}" for k, v in dict(s.task_args or cfg.task.args).items())
    time_s = sft.get("metrics", {}).get("sft/time_s")
    loss = sft.get("metrics", {}).get("sft/final_loss")
    lines = [
        "The long-output setting (`chain` task, `configs/chain.yaml`: prompts `31~040=`, n steps "
        f"`(a, b) -> (b, (a op b) mod {knobs.modulus})`, a response of 10 n + 4 characters and the eos): the SFT "
        "start policy at several response lengths, on held-out problems of each length's band; greedy decoding "
        f"(`evaluate`) and one sample per problem at the rollout temperature ({temperature}). Cells are "
        "*greedy / sampled*.",
        "",
        f"- **SFT recipe** (cached warm start `{sft.get('path', '?')}`): {s.steps} steps, batch {s.batch_size}, "
        f"lr {s.lr}, warm-up {s.warmup_steps} steps, on chain problems with {sft_args}; "
        + (f"SFT time {time_s / 60:.1f} min" if time_s is not None else "SFT time not recorded")
        + (f", final loss {loss:.4f}" if loss is not None else "")
        + ".",
        f"- **Task knobs** (`task.args`; each row sets min_steps, max_steps to its band): min_steps "
        f"{knobs.min_steps}, max_steps {knobs.max_steps}, modulus {knobs.modulus}, heldout_mod {knobs.heldout_mod}.",
        f"- **Problems**: {problems} held-out draws per row from the chains of **n - {BAND} .. n + {BAND} steps** "
        f"(clipped to 1 .. {MAX_STEPS}; the *steps* column, with the draws' mean length): one length has only "
        f"{knobs.modulus**2} prompts, "
        f"about 1 in {knobs.heldout_mod} held out. The distinct prompts among the draws are in the table; greedy "
        "decodes each once and counts it by its draws. Budget `max_new_tokens = 10 k + 4 + max(16, k)` at the "
        "band's longest chain k.",
        "- **Per-step accuracy p** = (correct steps before the first error) / (those + solutions with a wrong or "
        "missing step), summed over problems: the chance that a step is right given every earlier one was. "
        "**p^n** is the solution accuracy a constant per-step accuracy predicts (averaged over the problems' "
        "lengths); **solutions** is the measured share with the right answer.",
        "",
        "| n | steps | response tokens at n (with eos) | budget | distinct prompts | generated tokens | stopped at eos "
        "| per-step accuracy p | p^n | solutions | wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        g, x = r.greedy, r.sampled
        lines.append(
            f"| {r.n} | {r.lengths[0]}-{r.lengths[1]} (mean {_mean_length(x):.1f}) | {10 * r.n + 5} | {r.budget} | "
            f"{r.distinct} | "
            f"{_pair(g.mean_tokens, x.mean_tokens, '.1f')} | {_pair(g.stopped, x.stopped, '.3f')} | "
            f"{_pair(g.per_step, x.per_step, '.4f')} | "
            f"{_pair(g.predicted, x.predicted, '.3f')} | {_pair(g.accuracy, x.accuracy, '.3f')} | {r.wall_s:.0f} |"
        )
    kinds = list(rows[0].greedy.errors) if rows else []
    lines += [
        "",
        "Where solutions first go wrong (`first_error`; problems, greedy / sampled): `wrong_value` a wrong result, "
        "`wrong_copy` wrong operands or operator, `wrong_counter` a wrong step number, `malformed` other text or a "
        "step past the end, `wrong_answer` every step right but the answer wrong or missing (an early answer, a "
        "truncated response).",
        "",
        "| n | " + " | ".join(kinds) + " |",
        "|---:|" + "---:|" * len(kinds),
    ]
    for r in rows:
        cells = [f"{r.greedy.errors[k]} / {r.sampled.errors[k]}" for k in kinds]
        lines.append(f"| {r.n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_long_report(
    results: str | Path | None = None,
    *,
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    problems: int | None = None,
    lengths: Sequence[int] | None = None,
    quick: bool = False,
    temperature: float | None = None,
    seed: int = SEED,
    progress: bool = True,
) -> tuple[list[LengthRow], str]:
    """The report on the config's SFT start (default: the packaged chain config); writes the
    results page at ``results`` (none when None). Returns the rows and the page body."""
    sets = (QUICK_SETS if quick else []) + list(overrides)
    cfg = load_config(config or packaged_config("chain"), sets)
    problems = problems or (QUICK_PROBLEMS if quick else PROBLEMS)
    lengths = tuple(lengths or (QUICK_LENGTHS if quick else LENGTHS))
    for n in lengths:
        length_task(cfg, n)  # a bad length or task fails before the SFT
    path, _ = cached_sft(cfg, progress=progress)
    state = json.loads((path / "trainer_state.json").read_text())
    model, tokenizer = load_policy(str(path), **policy_options(cfg))
    model.to(resolve_device(cfg.policy.device))
    model.eval()
    temperature = cfg.rollout.temperature if temperature is None else temperature
    rows = measure(model, tokenizer, cfg, lengths=lengths, problems=problems, temperature=temperature, seed=seed)
    sft_info = {"path": path.name, "metrics": state.get("metrics", {})}
    body = render(rows, cfg, sft_info, temperature, problems)
    print(body, flush=True)
    title = "Long outputs: the chain task's SFT start by response length"
    write_results(results, title + (" (quick: numbers meaningless)" if quick else ""), body)
    return rows, body


def main(args: argparse.Namespace) -> None:
    run_long_report(
        args.results,
        config=args.config,
        overrides=args.set,
        problems=args.problems,
        lengths=args.lengths,
        quick=args.quick,
        temperature=args.temperature,
    )


def cli(argv: list[str] | None = None) -> int:
    p = parser(
        "long_outputs",
        __doc__,
        out=None,
        quick="a 20-step SFT, lengths 2 and 4 (numbers meaningless)",
        results="also write the report as a results page (e.g. docs/results/long_outputs.md)",
    )
    p.add_argument("--problems", type=int, default=None, help="held-out problems per length (default 256; quick: 8)")
    p.add_argument(
        "--lengths", type=int, nargs="+", default=None, metavar="N", help="chain lengths (default 6 25 51 99)"
    )
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default rollout.temperature)")
    return run(main, p, argv)


if __name__ == "__main__":
    raise SystemExit(cli())
