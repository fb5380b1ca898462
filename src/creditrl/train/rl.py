"""The RL loop: wiring only. The parts come from the build layer (:mod:`creditrl.train.build`);
each iteration runs the stages of :mod:`creditrl.train.stages` in order, each timed.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON object
per iteration), ``completions.jsonl`` (``train.log_completions``) and ``checkpoints/iter_NNNNNN``.
Every iteration draws its prompts and its sampling generator from ``(train.seed, iteration)``
alone, so a resumed run replays exactly the iterations an uninterrupted run would have.

Data-parallel learner (``torchrun`` or ``accelerate launch``, see :mod:`creditrl.distributed.ddp`):
every rank draws the same problems, keeps its ``prompts_per_iter / N`` whole prompt groups and
samples them with its own generator (``iteration_seed + rank * RANK_SEED_STRIDE``); metrics are
reduced over the ranks; rank 0 alone evaluates and writes the run directory.

Ctrl-C and SIGTERM stop a run at its last finished iteration (:mod:`creditrl.train.lifecycle`). A
new run that fails before its first checkpoint leaves no run files behind, so the same command can
simply run again.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from creditrl.config import Config
from creditrl.distributed import ddp
from creditrl.policy.model import LORA_BASE_FILE, is_lora
from creditrl.tasks import Task
from creditrl.train import rundir, stages
from creditrl.train.build import RunParts, build_run
from creditrl.train.checkpoint import (
    CheckpointWriteError,
    latest_name,
    load_extra,
    load_training_state,
    mark_latest,
    push_folder,
    resume_checkpoint,
    rng_state,
    save_checkpoint,
    write_failure,
)
from creditrl.train.lifecycle import Interrupted, Signals, checked_resume_config, resume_command
from creditrl.train.metrics import IterationRecord, StageTimer, iteration_row, sample_completions
from creditrl.train.rl_output import RunOutput
from creditrl.train.rl_start import RANK_SEED_STRIDE, RunStart, iteration_seed
from creditrl.train.trackers import Tracker, make_trackers
from creditrl.usage import run_cpu_s

log = logging.getLogger("creditrl")


@dataclass
class RLResult:
    run_dir: Path
    history: list[dict[str, Any]]  # every metrics.jsonl row


class RLTrainer(RunStart, RunOutput):
    """Runs the iterations of a built run (:class:`~creditrl.train.build.RunParts`); its start of
    a run (:class:`~creditrl.train.rl_start.RunStart`) and its output
    (:class:`~creditrl.train.rl_output.RunOutput`) are mixins of their own modules."""

    def __init__(self, parts: RunParts, run_dir: Path, *, overwrite: bool = False) -> None:
        """``overwrite``: a new run may replace one already in ``run_dir`` (else :meth:`run` refuses)."""
        self.parts = parts
        self.plan = parts.plan  # every setting the loop reads (the config is not read past the build)
        self.cfg = parts.config  # the resolved config, for callers that inspect a built run
        self.run_dir = Path(run_dir)
        self.overwrite = overwrite
        self.resumed = False
        self.trackers: list[Tracker] = []  # train.report_to, on rank 0 while the run lives
        if ddp.is_main():  # only rank 0 writes (a default timestamped name may differ on other ranks)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.start_iteration = 0
        self.finished = 0  # the last iteration logged and, where due, checkpointed
        self.finished_rng: dict[str, Any] | None = None  # the RNG states right after it
        self.signals = Signals(active=False)  # SIGINT / SIGTERM while run() runs
        self.totals = {"samples": 0, "tokens": 0, "time_s": 0.0}
        self.cpu_base = run_cpu_s()  # this process's share of the run counts from here (cpu_s)
        self.cpu_carried: float | None = 0.0  # the earlier processes' share, up to the checkpoint resumed from
        self.completions_per_iter = self.plan.log_completions if ddp.is_main() else 0
        self.completions: list[dict[str, Any]] = []  # the last iteration's sample (train.log_completions)

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        run_dir: Path,
        *,
        init_path: str | None = None,
        task: Task | None = None,
        overwrite: bool = False,
    ) -> RLTrainer:
        """Build the run of ``cfg`` (:func:`~creditrl.train.build.build_run`) and a trainer for it."""
        return cls(build_run(cfg, init_path=init_path, task=task), run_dir, overwrite=overwrite)

    # -- persistence -------------------------------------------------------------------------
    def save(self, iteration: int, rng: dict[str, Any] | None = None) -> None:
        """Checkpoint ``iteration`` (``rng``: the RNG states to save, default the current ones).

        Raises:
            CheckpointWriteError: One line naming the checkpoint, the last intact one and what
                to run next.
        """
        p = self.parts
        name = f"iter_{iteration:06d}"
        state = {"iteration": iteration, "totals": self.totals, "init_path": p.init_path, "cpu_s": self.cpu_s()}
        extra = {"value": p.value_stage.state_dict()}
        if p.scorer.calibrator is not None:
            extra["calibrator"] = p.scorer.calibrator.state_dict()
        if p.scorer.learners:
            extra["scorer"] = p.scorer.state_dict()
        if p.scaler is not None:
            extra["grad_scaler"] = p.scaler.state_dict()
        files = {LORA_BASE_FILE: json.dumps({"base": p.init_path})} if is_lora(p.model) else None
        optimizer = None if p.learners.sharded else p.optimizer  # an FSDP optimizer holds this rank's shards only
        path = self.run_dir / "checkpoints" / name
        try:
            save_checkpoint(path, p.model, p.tokenizer, optimizer, state, extra, files=files, rng=rng)
            try:
                mark_latest(path.parent, name)
            except OSError as exc:
                raise write_failure(exc, path) from exc
        except CheckpointWriteError as exc:
            if self.resumed or latest_name(path.parent):
                then = f"resume with: {resume_command(self.run_dir)}"
            else:
                then = "run the same command again"
            raise CheckpointWriteError(f"{exc}; {then}") from exc.__cause__

    @classmethod
    def resume(cls, run_dir: Path, overrides: list[str] | tuple[str, ...] = ()) -> RLTrainer:
        """Rebuild a trainer from ``run_dir``'s config and latest checkpoint (the same build path).
        ``overrides`` (``--set``) may change only what leaves the trained iterations as they were
        (:data:`creditrl.train.lifecycle.RESUMABLE`: the number of iterations, cadences, trackers)."""
        run_dir = Path(run_dir)
        config = checked_resume_config(run_dir / "config.yaml", list(overrides), launched=ddp.launched())
        rundir.remove_partial_checkpoints(run_dir)
        ckpt = resume_checkpoint(run_dir / "checkpoints")
        if ckpt is None:  # killed before its first checkpoint: the run starts again from iteration 0
            log.warning("creditrl: %s has no checkpoint yet; the run starts again from iteration 0", run_dir)
            started = run_dir / rundir.RUN_STATE
            init_path = json.loads(started.read_text())["init_path"] if started.exists() else None
            trainer = cls(build_run(config, init_path=init_path), run_dir)
            trainer._restart()
            return trainer
        state = json.loads((ckpt / "trainer_state.json").read_text())
        log.info("creditrl: resuming %s from checkpoint %s (iteration %d)", run_dir, ckpt.name, state["iteration"])
        trainer = cls(build_run(config, init_path=state["init_path"], checkpoint=ckpt), run_dir)
        trainer._restore(ckpt)
        return trainer

    def _restore(self, ckpt: Path) -> None:
        p = self.parts
        state = load_training_state(ckpt, p.optimizer)
        extra = load_extra(ckpt)
        p.value_stage.load_state_dict(extra.get("value", {}))
        if p.scorer.calibrator is not None and "calibrator" in extra:
            p.scorer.calibrator.load_state_dict(extra["calibrator"])
        if p.scorer.learners:
            p.scorer.load_state_dict(extra["scorer"])
        if p.scaler is not None and "grad_scaler" in extra:
            p.scaler.load_state_dict(extra["grad_scaler"])
        self.start_iteration = self.finished = state["iteration"]
        self.totals = state["totals"]
        self.cpu_carried = state.get("cpu_s")  # None: a checkpoint written before runs recorded it
        self._restart()

    def cpu_s(self) -> float | None:
        """The CPU seconds (:func:`creditrl.usage.run_cpu_s`) the run has spent so far over the
        processes that ran it: the checkpoint it resumed from records the earlier ones' share up to
        that checkpoint, and this process adds its own since ``cpu_base`` (set at construction; a
        caller that also wants the build counted sets it to its own earlier reading). A stopped
        process's CPU after its last checkpoint is not counted: those iterations are run again, and
        charged, by the process that resumes. None when the run resumed from a checkpoint that does
        not record it."""
        return None if self.cpu_carried is None else self.cpu_carried + run_cpu_s() - self.cpu_base

    def _restart(self) -> None:
        """Resume at ``start_iteration``: drop the metric rows and completions written after it
        (those iterations are replayed), rewriting ``metrics.jsonl`` and ``completions.jsonl`` atomically."""
        self.resumed = True
        for path in (self.metrics_path, self.completions_path):
            if ddp.is_main() and path.exists():
                rows = rundir.read_metrics(path)
                rundir.write_metrics(path, [r for r in rows if r["iteration"] <= self.start_iteration])

    # -- the loop ------------------------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, Any]:
        p, plan = self.parts, self.plan
        gen = torch.Generator().manual_seed(iteration_seed(plan.seed, it) + RANK_SEED_STRIDE * ddp.rank())
        lr, lam, progress = plan.lr_at(it), plan.lam_at(it), plan.progress_at(it)
        for group in p.optimizer.param_groups:
            group["lr"] = lr
        train_policy = it >= plan.critic_only_iterations  # false during the critic warm-up
        timer = StageTimer()
        with timer("rollout"):
            batch = self._rollout(it, gen)
        with timer("reference"):
            ref_logp = stages.reference_logprobs(
                p.reference,
                batch,
                plan.precision,
                packed=plan.packed,
                max_positions=plan.inference_positions,
            )
        self.signals.hold()  # from here the run's state changes: a signal waits for the iteration's end
        with timer("score"):
            scored = p.scorer(batch, progress=progress, generator=gen, ref_logprobs=ref_logp)
        with timer("value"):
            values = p.value_stage(batch, scored.step_ends, gen)
        with timer("credit"):
            adv, ret = stages.credit(
                batch, scored, plan.credit, values=values.values, lam=lam, step_ends=values.step_ends
            )
        with timer("update"):
            upd = stages.learn(p, batch, scored, adv, ret, values, ref_logp, gen, train_policy=train_policy)
        stats = p.engine.stats() if plan.ray else {}  # backend/restarts, time/sync_s
        if plan.credit.lam_alpha:  # VAPO's per-response lambda of the advantages, averaged
            stats["credit/lam_policy_mean"] = stages.policy_lam_mean(batch, scored, plan.credit, values.step_ends)
        record = IterationRecord(it + 1, batch, scored, values, adv, ret, upd, lr, lam, train_policy, stats)
        self._inspect(record)  # outside the stage timers
        self.completions = sample_completions(record, self.completions_per_iter)
        self._count(batch.size, stages.generated_tokens(batch), timer.total)
        return iteration_row(record, timer.times, self.totals)

    def run(self) -> RLResult:
        """Train to ``train.iterations`` (or the token budget), holding the run directory's lock
        (:mod:`creditrl.train.rundir`); a new run refuses a directory that holds one unless
        ``overwrite``."""
        if not ddp.is_main():  # data-parallel: rank 0 writes the run directory, evaluates and checkpoints
            return self._run()
        with rundir.hold(self.run_dir), Signals() as self.signals:
            if not self.resumed:
                rundir.check_fresh(self.run_dir, overwrite=self.overwrite)
            try:
                rundir.remove_partial_checkpoints(self.run_dir)
                (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.plan.saved_config, sort_keys=False))
                (self.run_dir / rundir.RUN_STATE).write_text(json.dumps({"init_path": self.parts.init_path}))
                first = self.start_iteration + 1 if self.resumed else 0  # trackers drop what they got from there
                self.trackers = make_trackers(list(self.plan.report_to), self.run_dir, self.plan.saved_config, first)
                return self._run()
            except Exception:
                self.close()
                if not self.resumed and latest_name(self.run_dir / "checkpoints") is None:
                    rundir.clear_run(self.run_dir)  # nothing to resume: the same command may simply run again
                raise
            finally:
                self.close()

    def _run(self) -> RLResult:
        history = rundir.read_metrics(self.metrics_path) if self.resumed else []
        try:
            self._iterations(history)
            if ddp.is_main():
                final = self.export_final()
                if self.plan.push_to_hub:
                    log.info("creditrl: %s uploaded to %s", final, push_folder(final, self.plan.push_to_hub))
        except Interrupted as exc:
            raise self._stopped(exc) from None
        self.close()
        return RLResult(self.run_dir, history)

    def _iterations(self, history: list[dict[str, Any]]) -> None:
        plan = self.plan
        if self.start_iteration == 0 and not history:
            pretrain = self._pretrain_critic() if plan.pretrain_iterations else {}
            row = {
                "iteration": 0,
                "samples/total": self.totals["samples"],
                "tokens/total": self.totals["tokens"],
                "time/total_s": self.totals["time_s"],
                **pretrain,
                **({"time/prm_s": self.parts.prm_s} if self.parts.prm_s else {}),
                **self.parts.prm,
                **self._evaluate_on_main(),
            }
            self._log(row, history)
        bar = tqdm(
            range(self.start_iteration, plan.iterations),
            initial=self.start_iteration,
            total=plan.iterations,
            desc=f"rl {plan.label}",
            disable=not plan.progress or not ddp.is_main() or not sys.stdout.isatty(),  # else plain lines
            dynamic_ncols=True,
        )
        last_eval = history[-1].get("eval/accuracy") if history else None
        with bar:  # closed (its line ended) also when a signal stops the run
            for it in bar:
                row = self.iteration(it)
                done = it + 1
                spent = plan.spent(self.totals["tokens"])
                if plan.due(done, plan.eval_every, spent):
                    row.update(self._evaluate_on_main())
                    last_eval = row.get("eval/accuracy")
                self._log(row, history, self.completions)
                if plan.due(done, plan.checkpoint_every, spent):
                    if ddp.is_main():
                        self.save(done)
                    ddp.barrier()
                self.finished, self.finished_rng = done, rng_state() if self.signals.active else None
                self.signals.release()  # a signal that came during the iteration stops the run here
                bar.set_postfix(reward=f"{row['reward/mean']:.2f}", acc=f"{row['train/accuracy']:.2f}", eval=last_eval)
                if spent:  # the token budget (train.max_tokens) is used up
                    break

    def close(self) -> None:
        """Stop the Ray workers (backend.name=ray) and drop the data-parallel wrappers (so that
        :func:`creditrl.distributed.ddp.shutdown` can leave the process group cleanly)."""
        if hasattr(self.parts.engine, "shutdown"):  # each part's close may run more than once
            self.parts.engine.shutdown()
        self.parts.scorer.close()  # the worker process of the bounded user-function calls
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
        self.parts.learners.close()
