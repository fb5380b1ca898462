"""The RL loop: wiring only. The parts come from the build layer (:mod:`creditrl.train.build`);
each iteration runs the stages of :mod:`creditrl.train.stages` in order, each timed.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON object
per iteration), ``completions.jsonl`` (``train.log_completions`` sample completions per
iteration, one JSON object each) and ``checkpoints/iter_NNNNNN`` (atomic). Every iteration
draws its prompts and its sampling generator from ``(train.seed, iteration)`` alone, so a
resumed run replays exactly the iterations an uninterrupted run would have.

Data-parallel learner (``torchrun --nproc_per_node N -m creditrl.cli train ...`` or
``accelerate launch``, see :mod:`creditrl.distributed.ddp`): every rank draws the same problems,
keeps its ``prompts_per_iter / N`` whole prompt groups and samples them with its own generator
(``iteration_seed + rank * RANK_SEED_STRIDE``); the update trains DDP wrappers of the policy and
critic with global loss denominators; metrics are reduced over the ranks; rank 0 alone
evaluates and writes ``metrics.jsonl``, the inspector's records and the checkpoints.

Ctrl-C and SIGTERM stop a run at its last finished iteration, checkpoint it when it has no
checkpoint yet, and raise :class:`~creditrl.train.lifecycle.Interrupted` naming the resume command
(:mod:`creditrl.train.lifecycle`). A new run that fails before its first checkpoint leaves no run
files behind, so the same command can simply run again.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from creditrl.config import Config
from creditrl.credit.schedule import linear_schedule
from creditrl.distributed import ddp
from creditrl.errors import ConfigError
from creditrl.inspect.record import record_iteration
from creditrl.losses import explained_variance
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
from creditrl.train.evaluate import evaluate
from creditrl.train.lifecycle import Interrupted, Signals, checked_resume_config, resume_command
from creditrl.train.metrics import (
    IterationRecord,
    StageTimer,
    iteration_row,
    pack_outcomes,
    progress_line,
    sample_completions,
)
from creditrl.train.trackers import Tracker, make_trackers

log = logging.getLogger("creditrl")
FINAL = "final"  # RUN_DIR/final: the trained policy, loadable with from_pretrained
RANK_SEED_STRIDE = 2**32  # data-parallel rank r samples its rollouts from iteration_seed + r * stride
PRETRAIN_SEED_OFFSET = 2**48  # value pretraining iteration k draws from iteration_seed(seed, k) + offset


def iteration_seed(seed: int, iteration: int) -> int:
    return seed * 1_000_003 + iteration


@dataclass
class RLResult:
    run_dir: Path
    history: list[dict[str, Any]]  # every metrics.jsonl row


class RLTrainer:
    """Runs the iterations of a built run (:class:`~creditrl.train.build.RunParts`)."""

    def __init__(self, parts: RunParts, run_dir: Path, *, overwrite: bool = False) -> None:
        """``overwrite``: a new run may replace one already in ``run_dir`` (else :meth:`run` refuses)."""
        self.parts = parts
        self.cfg = parts.config
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
        self.completions_per_iter = self.cfg.train.log_completions if ddp.is_main() else 0
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
    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def completions_path(self) -> Path:
        return self.run_dir / "completions.jsonl"

    def save(self, iteration: int, rng: dict[str, Any] | None = None) -> None:
        """Checkpoint ``iteration`` (``rng``: the RNG states to save, default the current ones).

        Raises:
            CheckpointWriteError: One line naming the checkpoint, the last intact one and what
                to run next.
        """
        p = self.parts
        name = f"iter_{iteration:06d}"
        state = {"iteration": iteration, "totals": self.totals, "init_path": p.init_path}
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
        cfg = checked_resume_config(run_dir / "config.yaml", list(overrides))
        if cfg.backend.learner == "fsdp" and ddp.launched():
            raise ConfigError(
                f"{run_dir}: resuming a backend.learner=fsdp run is not supported (its checkpoints hold "
                "the weights but not the sharded optimizer state)"
            )
        rundir.remove_partial_checkpoints(run_dir)
        ckpt = resume_checkpoint(run_dir / "checkpoints")
        if ckpt is None:  # killed before its first checkpoint: the run starts again from iteration 0
            log.warning("creditrl: %s has no checkpoint yet; the run starts again from iteration 0", run_dir)
            started = run_dir / rundir.RUN_STATE
            init_path = json.loads(started.read_text())["init_path"] if started.exists() else None
            trainer = cls(build_run(cfg, init_path=init_path), run_dir)
            trainer._restart()
            return trainer
        state = json.loads((ckpt / "trainer_state.json").read_text())
        log.info("creditrl: resuming %s from checkpoint %s (iteration %d)", run_dir, ckpt.name, state["iteration"])
        trainer = cls(build_run(cfg, init_path=state["init_path"], checkpoint=ckpt), run_dir)
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
        self._restart()

    def _restart(self) -> None:
        """Resume at ``start_iteration``: drop the metric rows and completions written after it
        (those iterations are replayed), rewriting ``metrics.jsonl`` and ``completions.jsonl`` atomically."""
        self.resumed = True
        for path in (self.metrics_path, self.completions_path):
            if ddp.is_main() and path.exists():
                rows = rundir.read_metrics(path)
                rundir.write_metrics(path, [r for r in rows if r["iteration"] <= self.start_iteration])

    # -- evaluation ----------------------------------------------------------------------------
    def _evaluate_on_main(self) -> dict[str, float]:
        """Held-out evaluation on rank 0 only ({} on the other ranks, which wait for it), with its
        wall time as ``time/eval_s`` (not part of ``time/total_s``, the iterations' time)."""
        start = time.perf_counter()
        out = {**self.evaluate(), "time/eval_s": 0.0} if ddp.is_main() else {}
        if out:
            out["time/eval_s"] = time.perf_counter() - start
        ddp.barrier()
        return out

    def evaluate(self) -> dict[str, float]:
        p, cfg = self.parts, self.cfg
        res = evaluate(
            p.model,
            p.tokenizer,
            p.task,
            p.heldout,
            max_new_tokens=cfg.rollout.max_new_tokens,
            engine=cfg.policy.engine,
            precision=cfg.policy.precision,
            kernels=cfg.policy.kernels,
            calls=p.scorer.calls,
            on_error=cfg.reward.on_error,
        )
        out = {"eval/accuracy": res.accuracy, "eval/step_accuracy": res.step_accuracy, "eval/length": res.mean_length}
        out.update(
            {"eval/errors": res.errors, "eval/timeouts": res.timeouts, "eval/correct": pack_outcomes(res.correct)}
        )
        reward = p.scorer.eval_reward(p.heldout, res.completions)  # the reward's own measure, e.g. BLEU
        if reward is not None:
            out["eval/reward"] = reward
        return out

    # -- the loop ------------------------------------------------------------------------------
    def _schedules(self, it: int) -> tuple[float, float, float]:
        """This iteration's learning rate (set on the optimizer), lambda and training progress."""
        cfg = self.cfg
        warmup = cfg.optim.warmup_iterations
        lr = cfg.optim.lr * (min(1.0, (it + 1) / warmup) if warmup else 1.0)
        for group in self.parts.optimizer.param_groups:
            group["lr"] = lr
        progress = it / max(1, cfg.train.iterations)
        return lr, linear_schedule(cfg.credit.lam, cfg.credit.lam_end, progress), progress

    def iteration(self, it: int) -> dict[str, Any]:
        p, cfg = self.parts, self.cfg
        gen = torch.Generator().manual_seed(iteration_seed(cfg.train.seed, it) + RANK_SEED_STRIDE * ddp.rank())
        lr, lam, progress = self._schedules(it)
        train_policy = it >= cfg.value.warmup_iterations  # false during the critic warm-up
        timer = StageTimer()
        with timer("rollout"):
            batch = self._rollout(it, gen)
        with timer("reference"):
            ref_logp = stages.reference_logprobs(
                p.reference,
                batch,
                cfg.policy.precision,
                packed=cfg.policy.forward == "auto",
                max_positions=cfg.optim.inference_positions,
            )
        self.signals.hold()  # from here the run's state changes: a signal waits for the iteration's end
        with timer("score"):
            scored = p.scorer(batch, progress=progress, generator=gen, ref_logprobs=ref_logp)
        with timer("value"):
            values = p.value_stage(batch, scored.step_ends, gen)
        with timer("credit"):
            adv, ret = stages.credit(batch, scored, cfg, values=values.values, lam=lam, step_ends=values.step_ends)
        with timer("update"):
            upd = stages.learn(p, batch, scored, adv, ret, values, ref_logp, gen, train_policy=train_policy)
        stats = p.engine.stats() if cfg.backend.name == "ray" else {}  # backend/restarts, time/sync_s
        if cfg.credit.lam_alpha:  # VAPO's per-response lambda of the advantages, averaged
            stats["credit/lam_policy_mean"] = stages.policy_lam_mean(batch, scored, cfg, values.step_ends)
        record = IterationRecord(it + 1, batch, scored, values, adv, ret, upd, lr, lam, train_policy, stats)
        self._inspect(record)  # outside the stage timers
        self.completions = sample_completions(record, self.completions_per_iter)
        self._count(batch.size, record.generated_tokens, timer.total)
        return iteration_row(record, timer.times, self.totals)

    def _pretrain_critic(self) -> dict[str, float]:
        """Value pretraining (VC-PPO, Yuan et al., 2025, arXiv:2503.01491): ``value.pretrain_iterations``
        rounds of rollout -> score -> value -> Monte-Carlo returns (lambda 1, whatever ``credit.lam``,
        ``lam_critic`` or ``lam_alpha`` say) -> a critic-only update, all from the start policy, before
        RL's first iteration. Their problems and samples come from ``iteration_seed(train.seed, k) +
        PRETRAIN_SEED_OFFSET``, apart from RL's. Returns iteration 0's ``pretrain/*`` metrics: each
        batch's explained variance is measured before the critic trains on it (a fresh sample), the
        first (the untrained critic) and the last; the last update's value loss; ``time/pretrain_s``."""
        p, cfg = self.parts, self.cfg
        start, evs, update = time.perf_counter(), [], {}
        for k in range(cfg.value.pretrain_iterations):
            seed = iteration_seed(cfg.train.seed, k) + PRETRAIN_SEED_OFFSET
            gen = torch.Generator().manual_seed(seed + RANK_SEED_STRIDE * ddp.rank())
            batch = self._rollout(k, gen, seed=seed)
            scored = p.scorer(batch, progress=0.0, generator=gen, ref_logprobs=None)
            values = p.value_stage(batch, scored.step_ends, gen)
            mc = {"lam": 1.0, "lam_critic": 1.0, "lam_alpha": 0.0}  # Monte-Carlo returns
            adv, ret = stages.credit(batch, scored, cfg, values=values.values, step_ends=values.step_ends, **mc)
            mask = batch.response_mask & scored.keep[:, None]
            (ev,) = ddp.all_reduce_mean([explained_variance(values.values, ret, mask)])
            evs.append(ev)
            update = stages.learn(p, batch, scored, adv, ret, values, None, gen, train_policy=False)
            self._count(batch.size, stages.generated_tokens(batch), 0.0)
            log.info(
                "creditrl: value pretraining %d/%d: explained variance %.3f", k + 1, cfg.value.pretrain_iterations, ev
            )
        seconds = time.perf_counter() - start
        self.totals["time_s"] += seconds
        return {
            "pretrain/iterations": len(evs),
            "pretrain/explained_variance_first": evs[0],
            "pretrain/explained_variance": evs[-1],
            "pretrain/loss_value": update.get("loss/value", 0.0),
            "time/pretrain_s": seconds,
        }

    def _rollout(self, it: int, generator: torch.Generator, *, seed: int | None = None):
        """This iteration's problems (the same on every rank; each keeps its share) and their samples;
        ``seed`` replaces the problems' seed ``iteration_seed(train.seed, it)``."""
        p, cfg = self.parts, self.cfg
        seed = iteration_seed(cfg.train.seed, it) if seed is None else seed
        problems = p.task.sample(cfg.rollout.prompts_per_iter, split="train", seed=seed)
        return stages.rollout(
            p.engine,
            p.tokenizer,
            ddp.share(problems),
            cfg.rollout.group_size,
            p.params,
            generator,
            tree=p.value_stage.tree,
            stop_ids=p.stop_ids,
        )

    def _inspect(self, rec: IterationRecord) -> None:
        """The credit inspector's sample of this iteration (every ``train.inspect_every``), on rank 0."""
        if ddp.is_main():
            record_iteration(
                self.run_dir,
                rec.iteration,
                rec.batch,
                rec.scored,
                rec.advantages,
                rec.returns,
                self.cfg,
                self.parts.tokenizer,
                self.parts.task,
                values=rec.values.values,
                credit_step_ends=rec.values.step_ends,
                lam=rec.lam,
            )

    def _count(self, samples: int, tokens: int, seconds: float) -> None:
        samples, tokens = (int(x) for x in ddp.all_reduce_sum([samples, tokens]))  # over every rank
        self.totals["samples"] += samples
        self.totals["tokens"] += tokens
        self.totals["time_s"] += seconds

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
                self.cfg.dump(self.run_dir / "config.yaml")
                (self.run_dir / rundir.RUN_STATE).write_text(json.dumps({"init_path": self.parts.init_path}))
                first = self.start_iteration + 1 if self.resumed else 0  # trackers drop what they got from there
                self.trackers = make_trackers(self.cfg.train.report_to, self.run_dir, self.cfg.to_dict(), first)
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
                if self.cfg.train.push_to_hub:
                    log.info("creditrl: %s uploaded to %s", final, push_folder(final, self.cfg.train.push_to_hub))
        except Interrupted as exc:
            raise self._stopped(exc) from None
        self.close()
        return RLResult(self.run_dir, history)

    def _iterations(self, history: list[dict[str, Any]]) -> None:
        cfg = self.cfg
        if self.start_iteration == 0 and not history:
            pretrain = self._pretrain_critic() if cfg.value.pretrain_iterations else {}
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
            range(self.start_iteration, cfg.train.iterations),
            initial=self.start_iteration,
            total=cfg.train.iterations,
            desc=f"rl {cfg.credit.estimator}/{cfg.reward.source}",
            disable=not cfg.train.progress or not ddp.is_main() or not sys.stdout.isatty(),  # else plain lines
            dynamic_ncols=True,
        )
        last_eval = history[-1].get("eval/accuracy") if history else None
        with bar:  # closed (its line ended) also when a signal stops the run
            for it in bar:
                row = self.iteration(it)
                done = it + 1
                spent = cfg.train.max_tokens and self.totals["tokens"] >= cfg.train.max_tokens
                if done % cfg.train.eval_every == 0 or done == cfg.train.iterations or spent:
                    row.update(self._evaluate_on_main())
                    last_eval = row.get("eval/accuracy")
                self._log(row, history, self.completions)
                if done % cfg.train.checkpoint_every == 0 or done == cfg.train.iterations or spent:
                    if ddp.is_main():
                        self.save(done)
                    ddp.barrier()
                self.finished, self.finished_rng = done, rng_state() if self.signals.active else None
                self.signals.release()  # a signal that came during the iteration stops the run here
                bar.set_postfix(reward=f"{row['reward/mean']:.2f}", acc=f"{row['train/accuracy']:.2f}", eval=last_eval)
                if spent:  # the token budget (train.max_tokens) is used up
                    break

    def _stopped(self, exc: Interrupted) -> Interrupted:
        """After SIGINT / SIGTERM: a checkpoint of the last finished iteration when it has none, and
        the one line saying where the run stopped and how to resume it."""
        self.signals.reset()
        done, total, ckpts = self.finished, self.cfg.train.iterations, self.run_dir / "checkpoints"
        resume = f"resume with: {resume_command(self.run_dir)}"
        if exc.at_once:  # a second signal: the iteration under way is abandoned, its state half-changed
            intact = latest_name(ckpts)
            since = f"checkpoint {intact}" if intact else "iteration 0"
            return exc.with_message(
                f"stopped by {exc.name} during iteration {done + 1} of {total} (abandoned, not saved); "
                f"the run continues from {since}; {resume}"
            )
        if done == 0:
            return exc.with_message(f"stopped by {exc.name} before the first iteration finished; {resume}")
        name = f"iter_{done:06d}"
        if latest_name(ckpts) == name:
            return exc.with_message(f"stopped by {exc.name} after iteration {done} of {total} ({name}); {resume}")
        try:
            self.save(done, rng=self.finished_rng)
        except Interrupted:
            intact = latest_name(ckpts)
            return exc.with_message(
                f"stopped by {exc.name} again while writing checkpoint {name}; the run continues from "
                f"{f'checkpoint {intact}' if intact else 'iteration 0'}; {resume}"
            )
        return exc.with_message(
            f"stopped by {exc.name} after iteration {done} of {total}; checkpoint {name} written; {resume}"
        )

    def export_final(self) -> Path:
        """The trained policy as a plain HF folder, ``RUN_DIR/final`` (``train.merge_lora``: LoRA
        adapters merged into the weights), written atomically; ``from_pretrained`` loads it."""
        p, final = self.parts, self.run_dir / FINAL
        model = p.model
        if is_lora(model) and self.cfg.train.merge_lora:
            model = copy.deepcopy(model).merge_and_unload()
        tmp = self.run_dir / (FINAL + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        p.tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final

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

    def _log(
        self, row: dict[str, Any], history: list[dict[str, Any]], completions: list[dict[str, Any]] | None = None
    ) -> None:
        """Write the metrics row (and the iteration's sample ``completions``) to the run directory
        and the trackers, on rank 0."""
        history.append(row)
        if ddp.is_main():
            with self.metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if completions:
                with self.completions_path.open("a") as f:
                    f.write("".join(json.dumps(c) + "\n" for c in completions))
            for tracker in self.trackers:
                tracker.log(row)
                if completions:
                    tracker.log_completions(row["iteration"], completions)
            if self.cfg.train.progress and not sys.stdout.isatty() and "reward/mean" in row:
                print(progress_line(row, self.cfg.train.iterations), flush=True)
