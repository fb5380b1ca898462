"""The output of an RL run (:mod:`creditrl.train.rl`): held-out evaluation, the metrics and
completions rows, the credit inspector's records, the line a stopped run ends with and the final
policy folder."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from creditrl.distributed import ddp
from creditrl.policy.model import is_lora
from creditrl.train.build import RunParts
from creditrl.train.checkpoint import latest_name
from creditrl.train.evaluate import evaluate
from creditrl.train.lifecycle import Interrupted, Signals, resume_command
from creditrl.train.metrics import IterationRecord, pack_outcomes, progress_line
from creditrl.train.plan import RunPlan
from creditrl.train.trackers import Tracker

FINAL = "final"  # RUN_DIR/final: the trained policy, loadable with from_pretrained


class RunOutput:
    """:class:`~creditrl.train.rl.RLTrainer`'s evaluation, logging, stop handling and export."""

    parts: RunParts
    plan: RunPlan
    run_dir: Path
    trackers: list[Tracker]
    signals: Signals
    finished: int
    finished_rng: dict[str, Any] | None

    # -- the run directory's files -----------------------------------------------------------
    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def completions_path(self) -> Path:
        return self.run_dir / "completions.jsonl"

    # -- evaluation ----------------------------------------------------------------------------
    def _evaluate_on_main(self) -> dict[str, float]:
        """Held-out evaluation on rank 0 only ({} on the other ranks, which wait for it), with its
        wall time as ``time/eval_s`` (not part of ``time/total_s``)."""
        start = time.perf_counter()
        out = {**self.evaluate(), "time/eval_s": 0.0} if ddp.is_main() else {}
        if out:
            out["time/eval_s"] = time.perf_counter() - start
        ddp.barrier()
        return out

    def evaluate(self) -> dict[str, float]:
        p, plan = self.parts, self.plan
        res = evaluate(
            p.model,
            p.tokenizer,
            p.task,
            p.heldout,
            max_new_tokens=plan.eval_max_new_tokens,
            engine=plan.eval_engine,
            precision=plan.precision,
            kernels=plan.eval_kernels,
            calls=p.scorer.calls,
            on_error=plan.on_error,
        )
        out = {"eval/accuracy": res.accuracy, "eval/step_accuracy": res.step_accuracy, "eval/length": res.mean_length}
        out.update(
            {"eval/errors": res.errors, "eval/timeouts": res.timeouts, "eval/correct": pack_outcomes(res.correct)}
        )
        reward = p.scorer.eval_reward(p.heldout, res.completions)  # the reward's own measure, e.g. BLEU
        if reward is not None:
            out["eval/reward"] = reward
        return out

    def _inspect(self, rec: IterationRecord) -> None:
        """The credit inspector's sample of this iteration (every ``train.inspect_every``), on rank 0."""
        if ddp.is_main():
            self.parts.inspector(
                self.run_dir,
                rec.iteration,
                rec.batch,
                rec.scored,
                rec.advantages,
                rec.returns,
                values=rec.values.values,
                credit_step_ends=rec.values.step_ends,
                lam=rec.lam,
            )

    def _stopped(self, exc: Interrupted) -> Interrupted:
        """After SIGINT / SIGTERM: a checkpoint of the last finished iteration when it has none, and
        the one line saying where the run stopped and how to resume it."""
        self.signals.reset()
        done, total, ckpts = self.finished, self.plan.iterations, self.run_dir / "checkpoints"
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
        if is_lora(model) and self.plan.merge_lora:
            model = copy.deepcopy(model).merge_and_unload()
        tmp = self.run_dir / (FINAL + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        p.tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final

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
            if self.plan.progress and not sys.stdout.isatty() and "reward/mean" in row:
                print(progress_line(row, self.plan.iterations), flush=True)
