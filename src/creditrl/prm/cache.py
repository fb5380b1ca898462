"""``reward.prm=auto``: a PRM trained on the start policy's own samples, once, then cached.

The PRM life cycle of ``creditrl prm label`` + ``creditrl prm train`` in one call: sample
``prm.problems x prm.samples`` solutions from the policy at ``init_path`` on the RL task
(``task.*``, ``prm.split``), label their steps with ``prm.labeler``, train with the ``prm.*``
settings, and evaluate step AUROC against the oracle labels on fresh held-out samples. The
result lives in ``$CREDITRL_CACHE/prm/<key>``, keyed by the start policy, the task, the
``prm`` section and ``rollout.max_new_tokens``; a run that finds it there trains nothing.
``prm.seed=run`` seeds labelling and training with ``train.seed``: each RL seed its own PRM, so
PRM variance is sampled with the seeds (the default, a fixed seed, shares one PRM among them).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from creditrl.config import Config, config_hash
from creditrl.policy.engines import SamplingParams
from creditrl.tasks import make_task
from creditrl.usage import charge_elsewhere, process_cpu_s

CACHE_VERSION = 2
EVAL_PROBLEMS = 128  # held-out problems (x prm.samples solutions) for the cached PRM's AUROC


def label_policy_samples(
    cfg: Config,
    model,
    tokenizer,
    *,
    problems: int | None = None,
    split: str | None = None,
    seed: int | None = None,
    labeler: str | None = None,
) -> tuple[list, dict[str, Any]]:
    """Sample the policy's solutions on ``cfg``'s task and label their steps (``prm.*``)."""
    from creditrl.prm.pipeline import label_samples, sample_solutions

    p = cfg.prm
    task = make_task(cfg.task.name, **cfg.task.args)
    seed = cfg.prm_seed if seed is None else seed
    todo = task.sample(p.problems if problems is None else problems, split=split or p.split, seed=seed)
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=p.temperature)
    samples = sample_solutions(model, tokenizer, task, todo, samples=p.samples, params=params, seed=seed)
    completer, completer_tok = load_completer(cfg, model, tokenizer)
    return label_samples(
        samples,
        labeler or p.labeler,
        task=task,
        model=completer,
        tokenizer=completer_tok,
        mc_n=p.mc_n,
        mc_mode=p.mc_mode,
        mc_max_rows=p.mc_rows_per_call,
        mc_max_positions=p.mc_positions_per_call,
        mc_params=SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=p.mc_temperature),
        vote_labelers=[x.strip() for x in p.vote_labelers.split(",")],
        vote_threshold=p.vote_threshold,
        seed=seed,
    )


def load_completer(cfg: Config, model, tokenizer):
    """The MC labeler's completer: ``prm.completer`` (a checkpoint directory, which must share the
    policy's tokenizer) or, when empty or the start policy itself (``train.init``, as a run
    resolves it), the policy ``model``."""
    path = cfg.prm.completer
    if not path or path == cfg.train.init:
        return model, tokenizer
    from creditrl.policy.model import load_policy

    if not Path(path).is_dir():
        raise ValueError(f"prm.completer: not a checkpoint directory: {path}")
    completer, tok = load_policy(path, seed=cfg.policy.init_seed)
    if tok.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"prm.completer: {path} has another tokenizer than the policy it labels for")
    return completer.eval(), tok


def prm_key(cfg: Config, init_path: str) -> str:
    prm = cfg.prm.model_dump()
    if prm["completer"] in ("", str(init_path)):  # the policy being labelled: out of the key
        del prm["completer"]
    del prm["mc_rows_per_call"], prm["mc_positions_per_call"]  # memory bounds: the same labels either way
    prm["seed"] = cfg.prm_seed  # `run` at train.seed s is the PRM of prm.seed=s: one entry, shared
    return config_hash(
        {
            "v": CACHE_VERSION,
            "init": str(init_path),
            "task": cfg.task.model_dump(),
            "prm": prm,
            "max_new_tokens": cfg.rollout.max_new_tokens,
        }
    )


def cached_prm(cfg: Config, init_path: str, *, progress: bool = False) -> Path:
    """The directory of the PRM for ``cfg`` trained from ``init_path`` (trained now if not cached).

    ``prm_info.json`` in it records the label statistics, the training metrics and the step AUROC
    against oracle labels on held-out samples (``prm/heldout_auroc``)."""
    from creditrl.cache import cache_lock, cache_root

    path = cache_root() / "prm" / prm_key(cfg, init_path)
    with cache_lock(path):  # parallel runs needing the same PRM: the first trains it, the others wait
        if not (path / "prm_info.json").exists():
            cpu = process_cpu_s()
            try:
                _train_prm(cfg, init_path, path, progress)
            finally:
                charge_elsewhere(process_cpu_s() - cpu)  # each run reading the PRM is charged its prm/cpu_s
    return path


def _prm_info(cfg: Config) -> dict[str, Any]:
    """The ``prm_info.json`` of the PRM a reward of ``cfg`` reads ({} when none does, or its
    directory has none: a PRM trained by ``creditrl prm train``)."""
    r = cfg.reward
    reads = "prm" in (r.source, *r.sources, cfg.hybrid.dense_source)
    info = Path(r.prm) / "prm_info.json" if reads and r.prm and r.prm != "auto" else None
    return json.loads(info.read_text()) if info is not None and info.is_file() else {}


def prm_cost_s(cfg: Config) -> float:
    """The seconds the PRM of ``cfg`` took to label its training samples and train (the
    held-out AUROC check excluded); 0 without a record (:func:`_prm_info`)."""
    return float(_prm_info(cfg).get("prm/cost_s", 0.0))


# what a run records of the PRM it reads, in its start row: its labels against the oracle's
# (the share that agree, the share of steps labelled, the false-positive rate) and its step AUROC
# on held-out samples; the keys of prm_info.json on the left
PRM_RECORD = {
    "agreement": "prm/label_agreement",
    "coverage": "prm/label_coverage",
    "false_positive_rate": "prm/label_fpr",
    "prm/heldout_auroc": "prm/heldout_auroc",
    "prm/generated_tokens": "prm/generated_tokens",
    "prm/trained_positions": "prm/trained_positions",
    "prm/cpu_s": "prm/cpu_s",
}


def prm_record(cfg: Config) -> dict[str, float]:
    """:data:`PRM_RECORD` of the PRM a reward of ``cfg`` reads ({} when none, or unrecorded; a
    held-out AUROC that could not be computed is left out)."""
    info = _prm_info(cfg)
    return {key: float(info[k]) for k, key in PRM_RECORD.items() if info.get(k) is not None}


def _train_prm(cfg: Config, init_path: str, path: Path, progress: bool) -> None:
    from creditrl.policy.model import load_policy, policy_options
    from creditrl.prm.pipeline import evaluate_prm, label_quality
    from creditrl.prm.source import load_prm
    from creditrl.prm.train import train_prm_from_examples

    model, tokenizer = load_policy(str(init_path), seed=cfg.policy.init_seed, **policy_options(cfg))
    model.eval()
    start, cpu = time.perf_counter(), process_cpu_s()
    with torch.no_grad():
        examples, info = label_policy_samples(cfg, model, tokenizer)
    label_s, label_cpu_s = time.perf_counter() - start, process_cpu_s() - cpu
    with torch.no_grad():
        heldout, _ = label_policy_samples(
            cfg, model, tokenizer, problems=EVAL_PROBLEMS, split="heldout", seed=cfg.prm_seed + 1, labeler="oracle"
        )
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cpu = process_cpu_s()
    metrics = train_prm_from_examples(cfg, str(init_path), examples, tmp, progress)
    train_cpu_s = process_cpu_s() - cpu
    prm, prm_tok = load_prm.__wrapped__(str(tmp))  # not the lru cache: the directory is renamed next
    try:  # a diagnostic: a start that never (or always) gets a step right has no AUROC
        auroc, note = evaluate_prm(prm, prm_tok, heldout)[0], None
    except ValueError as exc:
        auroc, note = None, str(exc)
    record = {
        "init": str(init_path),
        "examples": len(examples),
        **info,
        **label_quality(examples),
        "prm/heldout_auroc": auroc,
        **({"prm/heldout_note": note} if note else {}),
        **{k: v for k, v in metrics.items() if k != "prm/loss_curve"},
        "prm/label_s": label_s,
        "prm/cost_s": label_s + metrics["prm/time_s"],  # what a run using this PRM is charged
        "prm/cpu_s": label_cpu_s + train_cpu_s,  # the same in CPU seconds (user + system)
        # the same in units no machine's speed changes: the samples and MC continuations generated
        # to label, and the token positions training forwarded and backpropagated
        "prm/generated_tokens": info["prm/sample_tokens"] + info.get("mc/tokens", 0),
    }
    (tmp / "prm_info.json").write_text(json.dumps(record, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
