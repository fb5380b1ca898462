"""The RL loop: wiring only. Each iteration runs the stages of :mod:`creditrl.train.stages`.

A run directory holds ``config.yaml`` (fully resolved), ``metrics.jsonl`` (one JSON object per
iteration), and ``checkpoints/iter_NNNNNN`` (atomic). Every iteration draws its prompts and its
sampling generator from ``(train.seed, iteration)`` alone, so a resumed run replays exactly the
iterations an uninterrupted run would have.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from creditrl.config import Config, load_config
from creditrl.policy.engine import SamplingParams
from creditrl.policy.static_engine import make_engine
from creditrl.policy.model import LORA_BASE_FILE, apply_lora, is_lora, load_policy
from creditrl.credit.schedule import linear_schedule
from creditrl.inspect.record import record_iteration
from creditrl.losses import explained_variance
from creditrl.rollout.batch import response_logits, token_logprobs
from creditrl.rewards.sources import score_batch
from creditrl.sandbox.passk import mean_pass_at_k
from creditrl.rollout.segment import step_stop_ids
from creditrl.tasks import make_task
from creditrl.train import stages
from creditrl.train.checkpoint import latest_checkpoint, load_extra, load_training_state, mark_latest, save_checkpoint
from creditrl.train.evaluate import evaluate
from creditrl.train.sft import cached_sft, policy_options
from creditrl.values.registry import VALUE_SOURCES
from creditrl.values.stage import ValueStage

EVAL_SEED = 12345  # the held-out problems are the same for every run of a config


def iteration_seed(seed: int, iteration: int) -> int:
    return seed * 1_000_003 + iteration


def resolve_init(cfg: Config, progress: bool) -> str:
    """The model path RL starts from (and the reference policy for KL)."""
    if cfg.train.init == "sft":
        path, _ = cached_sft(cfg, progress=progress)
        return str(path)
    if cfg.train.init == "policy":
        return cfg.policy.model
    return cfg.train.init


@dataclass
class RLResult:
    run_dir: Path
    history: list[dict[str, Any]]  # every metrics.jsonl row


class RLTrainer:
    """Holds the model, reference, optimizer and task; ``run()`` executes the iterations."""

    def __init__(self, cfg: Config, run_dir: Path, *, init_path: str | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.init_path = init_path or resolve_init(cfg, cfg.train.progress)
        if cfg.reward.prm == "auto":  # a PRM trained (once, then cached) on this start policy's samples
            from creditrl.prm.cache import cached_prm

            cfg.reward.prm = str(cached_prm(cfg, self.init_path, progress=cfg.train.progress))
        options = policy_options(cfg)
        self.model, self.tokenizer = load_policy(self.init_path, seed=cfg.policy.init_seed, **options)
        self.ref_model = None
        if cfg.loss.kl_coef > 0 or cfg.shaping.kl_coef > 0:
            self.ref_model, _ = load_policy(self.init_path, seed=cfg.policy.init_seed, **options)
            self.ref_model.eval().requires_grad_(False)
        # a separate critic copies the plain policy: LoRA injects its adapters in place
        critic_source = self.model
        if cfg.policy.lora_r:
            if VALUE_SOURCES[cfg.value.source].kind == "critic":
                critic_source = copy.deepcopy(self.model)
            p = cfg.policy
            self.model = apply_lora(self.model, r=p.lora_r, alpha=p.lora_alpha, dropout=p.lora_dropout,
                                    targets=p.lora_targets)
        if cfg.policy.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.optimizer = self._optimizer()
        self.task = make_task(cfg.task.name, **cfg.task.args)
        self.scorer = stages.Scorer(cfg, self.task, self.tokenizer)
        self.engine = make_engine(
            self.model, eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id, kind=cfg.policy.engine
        )
        self.params = SamplingParams(
            max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p
        )
        self.value_stage = ValueStage(cfg, critic_source, self.engine, self.tokenizer, self.task, self.params)
        separator = cfg.reward.step_separator or getattr(self.task, "step_separator", None)
        self.stop_ids = step_stop_ids(self.tokenizer, separator) if self.value_stage.tree else ()
        self.heldout = self.task.sample(cfg.train.eval_size, split="heldout", seed=EVAL_SEED)
        self.start_iteration = 0
        self.totals = {"samples": 0, "tokens": 0, "time_s": 0.0}

    def _optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the trainable parameters (all of them, or the LoRA adapters)."""
        cfg = self.cfg
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, betas=(0.9, 0.99))

    # -- persistence -------------------------------------------------------------------------
    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def save(self, iteration: int) -> None:
        ckpt_dir = self.run_dir / "checkpoints"
        name = f"iter_{iteration:06d}"
        state = {"iteration": iteration, "totals": self.totals, "init_path": self.init_path}
        extra = {"value": self.value_stage.state_dict()}
        if self.scorer.calibrator is not None:
            extra["calibrator"] = self.scorer.calibrator.state_dict()
        files = {LORA_BASE_FILE: json.dumps({"base": self.init_path})} if is_lora(self.model) else None
        save_checkpoint(ckpt_dir / name, self.model, self.tokenizer, self.optimizer, state, extra, files=files)
        mark_latest(ckpt_dir, name)

    @classmethod
    def resume(cls, run_dir: Path) -> "RLTrainer":
        """Rebuild a trainer from ``run_dir``'s config and latest checkpoint."""
        run_dir = Path(run_dir)
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"{run_dir}: no checkpoints/latest to resume from")
        cfg = load_config(run_dir / "config.yaml")
        state = json.loads((ckpt / "trainer_state.json").read_text())
        trainer = cls(cfg, run_dir, init_path=state["init_path"])
        trainer.model, _ = load_policy(str(ckpt), **policy_options(cfg))  # a LoRA checkpoint: base + adapter
        if cfg.policy.gradient_checkpointing:
            trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        trainer.engine.model = trainer.model
        if not cfg.policy.lora_r:  # with LoRA the critic was built from the plain policy (never shared)
            trainer.value_stage.set_policy(trainer.model)
        trainer.optimizer = trainer._optimizer()
        load_training_state(ckpt, trainer.optimizer)
        extra = load_extra(ckpt)
        trainer.value_stage.load_state_dict(extra.get("value", {}))
        if trainer.scorer.calibrator is not None and "calibrator" in extra:
            trainer.scorer.calibrator.load_state_dict(extra["calibrator"])
        trainer.start_iteration = state["iteration"]
        trainer.totals = state["totals"]
        # drop metric rows written after the checkpoint (the iterations are replayed)
        if trainer.metrics_path.exists():
            rows = [json.loads(x) for x in trainer.metrics_path.read_text().splitlines() if x.strip()]
            kept = [r for r in rows if r["iteration"] <= trainer.start_iteration]
            trainer.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return trainer

    # -- the loop ------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        res = evaluate(
            self.model, self.tokenizer, self.task, self.heldout,
            max_new_tokens=self.cfg.rollout.max_new_tokens, engine=self.cfg.policy.engine,
        )
        out = {"eval/accuracy": res.accuracy, "eval/step_accuracy": res.step_accuracy, "eval/length": res.mean_length}
        source = self.scorer.primary.source
        if "sequence" in source.granularities:  # the reward's own measure, e.g. BLEU where exact match is rare
            scores = score_batch(source, self.task, self.heldout, res.completions, [[c] for c in res.completions],
                                 granularity="sequence", on_error="zero").scores
            out["eval/reward"] = sum(s[0] for s in scores) / max(1, len(scores))
        return out

    def iteration(self, it: int) -> dict[str, Any]:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(iteration_seed(cfg.train.seed, it))
        warmup = cfg.optim.warmup_iterations
        lr = cfg.optim.lr * (min(1.0, (it + 1) / warmup) if warmup else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        progress = it / max(1, cfg.train.iterations)
        lam = linear_schedule(cfg.credit.lam, cfg.credit.lam_end, progress)
        clock = [time.perf_counter()]
        problems = self.task.sample(cfg.rollout.prompts_per_iter, split="train", seed=iteration_seed(cfg.train.seed, it))
        batch = stages.rollout(
            self.engine, self.tokenizer, problems, cfg.rollout.group_size, self.params, gen,
            tree=self.value_stage.tree, stop_ids=self.stop_ids,
        )
        ref_logp = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp = token_logprobs(response_logits(self.ref_model, batch), batch.response_ids)
        clock.append(time.perf_counter())
        scored = self.scorer(batch, progress=progress, generator=gen, ref_logprobs=ref_logp)
        clock.append(time.perf_counter())
        vout = self.value_stage(batch, scored.step_ends, gen)
        clock.append(time.perf_counter())
        adv, ret = stages.credit(batch, scored, cfg, values=vout.values, lam=lam, step_ends=vout.step_ends)
        clock.append(time.perf_counter())
        mask = batch.response_mask & scored.keep[:, None]
        critic = None
        if self.value_stage.critic is not None:
            critic = stages.CriticTarget(self.value_stage.critic, self.value_stage.optimizer, ret, vout.member_values)
        train_policy = it >= cfg.value.warmup_iterations
        upd = stages.update(
            self.model, self.optimizer, batch, adv, mask, cfg, gen,
            ref_logprobs=ref_logp, critic=critic, train_policy=train_policy,
        )
        clock.append(time.perf_counter())
        record_iteration(  # the credit inspector's sample (train.inspect_every); outside the stage timers
            self.run_dir, it + 1, batch, scored, adv, ret, cfg, self.tokenizer, self.task,
            values=vout.values, credit_step_ends=vout.step_ends, lam=lam,
        )
        n_tokens = stages.generated_tokens(batch)
        self.totals["samples"] += batch.size
        self.totals["tokens"] += n_tokens
        self.totals["time_s"] += clock[-1] - clock[0]
        seq_reward = (scored.rewards * batch.response_mask).sum(-1)
        row: dict[str, Any] = {
            "iteration": it + 1,
            "reward/mean": float(seq_reward.mean()),
            "reward/std": float(seq_reward.std()) if batch.size > 1 else 0.0,
            "reward/placed_per_response": float(scored.reward_mask.sum(-1).float().mean()),
            "reward/errors": scored.errors,
            "reward/filtered": scored.filtered,
            **scored.stats,
            "train/accuracy": float(scored.outcome.mean()),
            **_pass_at_k(batch.group_ids, scored.outcome),
            "train/step_accuracy": float(scored.step_correct.mean()),
            "response/length": float(batch.response_lengths.float().mean()),
            "response/truncated": float((~batch.finished).float().mean()),
            "tokens/generated": n_tokens,
            "tokens/padded": batch.size * (batch.prompt_ids.shape[1] + batch.response_ids.shape[1]),
            **_stats("adv", adv, mask),
            **_stats("return", ret, mask),
            "credit/lam": lam,
            "optim/lr": lr,
            "policy/updated": float(train_policy),
            **upd,
            **vout.stats,
        }
        if vout.values is not None:
            row.update(_stats("value", vout.values, mask))
            row["value/explained_variance"] = explained_variance(vout.values, ret, mask)
        row.update(
            {
                "time/rollout_s": clock[1] - clock[0],
                "time/score_s": clock[2] - clock[1],
                "time/value_s": clock[3] - clock[2],
                "time/credit_s": clock[4] - clock[3],
                "time/update_s": clock[5] - clock[4],
                "time/iter_s": clock[5] - clock[0],
                "samples/total": self.totals["samples"],
                "tokens/total": self.totals["tokens"],
                "time/total_s": self.totals["time_s"],
            }
        )
        return row

    def run(self) -> RLResult:
        cfg = self.cfg
        cfg.dump(self.run_dir / "config.yaml")
        history: list[dict[str, Any]] = []
        if self.metrics_path.exists():
            history = [json.loads(x) for x in self.metrics_path.read_text().splitlines() if x.strip()]
        if self.start_iteration == 0 and not history:
            row = {"iteration": 0, "samples/total": 0, "tokens/total": 0, "time/total_s": 0.0, **self.evaluate()}
            self._log(row, history)
        bar = tqdm(
            range(self.start_iteration, cfg.train.iterations),
            initial=self.start_iteration,
            total=cfg.train.iterations,
            desc=f"rl {cfg.credit.estimator}/{cfg.reward.source}",
            disable=not cfg.train.progress,
            dynamic_ncols=True,
        )
        last_eval = history[-1].get("eval/accuracy") if history else None
        for it in bar:
            row = self.iteration(it)
            done = it + 1
            spent = cfg.train.max_tokens and self.totals["tokens"] >= cfg.train.max_tokens
            if done % cfg.train.eval_every == 0 or done == cfg.train.iterations or spent:
                row.update(self.evaluate())
                last_eval = row["eval/accuracy"]
            self._log(row, history)
            if done % cfg.train.checkpoint_every == 0 or done == cfg.train.iterations or spent:
                self.save(done)
            bar.set_postfix(reward=f"{row['reward/mean']:.2f}", acc=f"{row['train/accuracy']:.2f}", eval=last_eval)
            if spent:  # the token budget (train.max_tokens) is used up
                break
        return RLResult(self.run_dir, history)

    def _log(self, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        history.append(row)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _pass_at_k(group_ids: torch.Tensor, outcome: torch.Tensor) -> dict[str, float]:
    """Unbiased pass@k (Chen et al. 2021) of the sampled groups, for k = 1 and k = the smallest
    group's size: ``train/pass@1``, ``train/pass@k`` and ``train/pass_k`` (= that k)."""
    counts = [(int((group_ids == g).sum()), int(outcome[group_ids == g].sum())) for g in group_ids.unique()]
    k = min(n for n, _ in counts)
    return {"train/pass@1": mean_pass_at_k(counts, 1), "train/pass@k": mean_pass_at_k(counts, k), "train/pass_k": k}


def _stats(prefix: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std and largest magnitude of ``x`` (B, T) over the valid tokens of ``mask``."""
    v = x[mask]
    return {
        f"{prefix}/mean": float(v.mean()) if v.numel() else 0.0,
        f"{prefix}/std": float(v.std()) if v.numel() > 1 else 0.0,
        f"{prefix}/abs_max": float(v.abs().max()) if v.numel() else 0.0,
    }
