"""``creditrl search``: one search method run from a whole config (the same one ``creditrl train``
takes): the task, the start policy (``train.init``), the PRM (``search.prm``, else ``reward.prm``;
``auto`` trains or finds the cached one) and the ORM. Beam search, MCTS and the PRM / ORM
selectors need a task with a step separator; greedy and majority vote run on any task."""

from __future__ import annotations

from creditrl.config import Config
from creditrl.policy.engines import engine_for
from creditrl.policy.model import load_policy, policy_options
from creditrl.prm.source import load_prm
from creditrl.search.methods import SearchResult, require_models, require_steps, search
from creditrl.train.build import start_policy
from creditrl.train.resolve import check, run_task


def run_search(cfg: Config) -> tuple[SearchResult, str]:
    """Run ``cfg.search`` on its problems; returns the result and a phrase naming what was searched."""
    task = run_task(cfg)
    cfg = check(cfg, task)
    s = cfg.search
    require_steps(s, task)
    prm_dir, orm_dir = s.prm or cfg.reward.prm, s.orm
    require_models(s, has_prm=prm_dir is not None, has_orm=orm_dir is not None)
    init_path = start_policy(cfg, task, progress=cfg.train.progress)
    if prm_dir == "auto" and s.needs_prm:
        from creditrl.prm.cache import cached_prm

        prm_dir = str(cached_prm(cfg, init_path, progress=cfg.train.progress))
    model, tok = load_policy(init_path, seed=cfg.policy.init_seed, **policy_options(cfg))
    model.eval()
    engine = engine_for(model, tok, cfg.policy)
    problems = task.sample(s.problems, split=s.split, seed=s.problem_seed)
    device = cfg.policy.device
    result = search(
        problems,
        engine=engine,
        tokenizer=tok,
        task=task,
        config=s,
        prm=load_prm(prm_dir, device, cfg.prm.format) if s.needs_prm else None,
        orm=load_prm(orm_dir, device) if s.needs_orm else None,
    )
    return result, f"{s.split} problems of task '{cfg.task.name}'"
