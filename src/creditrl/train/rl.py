"""The RL loop: wiring only. Each iteration runs the stages of :mod:`creditrl.train.stages`.

A run directory holds ``config.yaml`` (fully resolved), ``metrics.jsonl`` (one JSON object per
iteration), and ``checkpoints/iter_NNNNNN`` (atomic). Every iteration draws its prompts and its
sampling generator from ``(train.seed, iteration)`` alone, so a resumed run replays exactly the
iterations an uninterrupted run would have.

Data-parallel learner (``torchrun --nproc_per_node N -m creditrl.cli train ...`` or
``accelerate launch``, see :mod:`creditrl.distributed.ddp`): every rank draws the same problems,
keeps its ``prompts_per_iter / N`` whole prompt groups and samples them with its own generator
(``iteration_seed + rank * RANK_SEED_STRIDE``); the update trains DDP wrappers of the policy and
critic with global loss denominators; metrics are reduced over the ranks; rank 0 alone
evaluates and writes ``metrics.jsonl``, the inspector's records and the checkpoints.
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

from creditrl.config import Config, ConfigError, load_config
from creditrl.policy.engine import SamplingParams
from creditrl.policy.static_engine import make_engine
from creditrl.policy.model import LORA_BASE_FILE, apply_lora, is_lora, load_policy
from creditrl.credit.schedule import linear_schedule
from creditrl.distributed import ddp
from creditrl.inspect.record import record_iteration
from creditrl.losses import explained_variance
from creditrl.policy.device import grad_scaler, inference, resolve_device
from creditrl.rollout.batch import response_logprobs
from creditrl.rewards.sources import score_batch
from creditrl.rollout.segment import step_stop_ids
from creditrl.tasks import make_task
from creditrl.train import stages
from creditrl.train.checkpoint import latest_checkpoint, load_extra, load_training_state, mark_latest, save_checkpoint
from creditrl.train.evaluate import evaluate
from creditrl.train.metrics import masked_stats, pass_at_k_metrics, reduce_row
from creditrl.train.sft import cached_sft, policy_options
from creditrl.train.update import make_optimizer
from creditrl.values.registry import VALUE_SOURCES
from creditrl.values.stage import ValueStage

EVAL_SEED = 12345  # the held-out problems are the same for every run of a config
RANK_SEED_STRIDE = 2**32  # data-parallel rank r samples its rollouts from iteration_seed + r * stride


def iteration_seed(seed: int, iteration: int) -> int:
    return seed * 1_000_003 + iteration


def resolve_init(cfg: Config, progress: bool) -> str:
    """The model path RL starts from (and the reference policy for KL)."""
    if cfg.train.init == "sft":
        with ddp.main_first():  # data-parallel ranks: rank 0 trains (or finds) the cache, the rest reuse it
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
        ddp.join_learner_group(cfg)  # a torchrun / accelerate launch: data-parallel ranks (no-op otherwise)
        self._policy_ddp: torch.nn.Module | None = None  # the learners' DDP wrappers, see _learners()
        self._critic_ddp: torch.nn.Module | None = None
        self.run_dir = Path(run_dir)
        if ddp.is_main():  # only rank 0 writes (a default timestamped name may differ on other ranks)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.init_path = init_path or resolve_init(cfg, cfg.train.progress)
        if cfg.reward.prm == "auto":  # a PRM trained (once, then cached) on this start policy's samples
            from creditrl.prm.cache import cached_prm

            with ddp.main_first():
                cfg.reward.prm = str(cached_prm(cfg, self.init_path, progress=cfg.train.progress))
        options = policy_options(cfg)
        self.device = resolve_device(cfg.policy.device)
        if self.device.type == "cuda":  # NCCL (data-parallel ranks) uses the current device
            torch.cuda.set_device(self.device)
        self.model, self.tokenizer = load_policy(self.init_path, seed=cfg.policy.init_seed, **options)
        self.model.to(self.device)
        self.ref_model = None
        if cfg.loss.kl_coef > 0 or cfg.shaping.kl_coef > 0:
            self.ref_model, _ = load_policy(self.init_path, seed=cfg.policy.init_seed, **options)
            self.ref_model.to(self.device).eval().requires_grad_(False)
        self.scaler = grad_scaler(self.device, cfg.policy.precision)  # fp16 loss scaling (None otherwise)
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
        # backend.learner=fsdp under torchrun: the update trains a sharded copy; self.model (generation,
        # evaluation, checkpoints) is refreshed from it after every update
        self._sharded = cfg.backend.learner == "fsdp" and ddp.is_distributed()
        if self._sharded:
            if cfg.policy.lora_r:
                raise ConfigError("backend.learner=fsdp does not shard LoRA adapters; use backend.learner=ddp")
            self._policy_ddp = ddp.wrap(copy.deepcopy(self.model), strategy="fsdp")
        self.optimizer = self._optimizer(self._policy_ddp if self._sharded else self.model)
        self.task = make_task(cfg.task.name, **cfg.task.args)
        self.scorer = stages.Scorer(cfg, self.task, self.tokenizer)
        if cfg.backend.name == "ray":  # rollout (and scoring) workers as Ray actors; ray is imported only here
            from creditrl.distributed.ray_backend import ray_engine

            self.engine = ray_engine(cfg, self.init_path, self.model, self.tokenizer, self.scorer)
        else:
            self.engine = make_engine(
                self.model, eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id, kind=cfg.policy.engine,
                precision=cfg.policy.precision, kernels=cfg.policy.kernels,
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

    def _learners(self) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        """The policy and the critic (or None) as the update trains them: DDP wrappers under a
        data-parallel launch, built on first use (and again for a policy swapped in by
        ``resume``); the plain modules in one process. Generation, evaluation and checkpoints
        always use the plain modules."""
        if not self._sharded and (self._policy_ddp is None or ddp.unwrap(self._policy_ddp) is not self.model):
            self._policy_ddp = ddp.wrap(self.model)
        if self._critic_ddp is None and self.value_stage.critic is not None:
            self._critic_ddp = ddp.wrap(self.value_stage.critic)
        return self._policy_ddp, self._critic_ddp

    def _optimizer(self, module: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """``optim.name`` over the trainable parameters (all of them, or the LoRA adapters) of ``module``
        (default the policy; the sharded learner with ``backend.learner=fsdp``)."""
        params = [p for p in (module or self.model).parameters() if p.requires_grad]
        return make_optimizer(params, self.cfg.optim)

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
        if self.scaler is not None:
            extra["grad_scaler"] = self.scaler.state_dict()
        files = {LORA_BASE_FILE: json.dumps({"base": self.init_path})} if is_lora(self.model) else None
        optimizer = None if self._sharded else self.optimizer  # an FSDP optimizer holds this rank's shards only
        save_checkpoint(ckpt_dir / name, self.model, self.tokenizer, optimizer, state, extra, files=files)
        mark_latest(ckpt_dir, name)

    @classmethod
    def resume(cls, run_dir: Path) -> "RLTrainer":
        """Rebuild a trainer from ``run_dir``'s config and latest checkpoint."""
        run_dir = Path(run_dir)
        cfg = load_config(run_dir / "config.yaml")
        if cfg.backend.learner == "fsdp" and ddp.launched():
            raise ConfigError(f"{run_dir}: resuming a backend.learner=fsdp run is not supported (its checkpoints hold "
                              "the weights but not the sharded optimizer state)")
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"{run_dir}: no checkpoints/latest to resume from")
        state = json.loads((ckpt / "trainer_state.json").read_text())
        trainer = cls(cfg, run_dir, init_path=state["init_path"])
        trainer.model, _ = load_policy(str(ckpt), **policy_options(cfg))  # a LoRA checkpoint: base + adapter
        trainer.model.to(trainer.device)
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
        if trainer.scaler is not None and "grad_scaler" in extra:
            trainer.scaler.load_state_dict(extra["grad_scaler"])
        trainer.start_iteration = state["iteration"]
        trainer.totals = state["totals"]
        # drop metric rows written after the checkpoint (the iterations are replayed)
        if ddp.is_main() and trainer.metrics_path.exists():
            rows = [json.loads(x) for x in trainer.metrics_path.read_text().splitlines() if x.strip()]
            kept = [r for r in rows if r["iteration"] <= trainer.start_iteration]
            trainer.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return trainer

    # -- the loop ------------------------------------------------------------------------------
    def _evaluate_on_main(self) -> dict[str, float]:
        """Held-out evaluation on rank 0 only ({} on the other ranks, which wait for it)."""
        out = self.evaluate() if ddp.is_main() else {}
        ddp.barrier()
        return out

    def evaluate(self) -> dict[str, float]:
        res = evaluate(
            self.model, self.tokenizer, self.task, self.heldout,
            max_new_tokens=self.cfg.rollout.max_new_tokens, engine=self.cfg.policy.engine,
            precision=self.cfg.policy.precision, kernels=self.cfg.policy.kernels,
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
        gen = torch.Generator().manual_seed(iteration_seed(cfg.train.seed, it) + RANK_SEED_STRIDE * ddp.rank())
        warmup = cfg.optim.warmup_iterations
        lr = cfg.optim.lr * (min(1.0, (it + 1) / warmup) if warmup else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        progress = it / max(1, cfg.train.iterations)
        lam = linear_schedule(cfg.credit.lam, cfg.credit.lam_end, progress)
        clock = [time.perf_counter()]
        problems = self.task.sample(cfg.rollout.prompts_per_iter, split="train", seed=iteration_seed(cfg.train.seed, it))
        problems = ddp.share(problems)  # data-parallel: this rank's whole prompt groups (all of them in one process)
        batch = stages.rollout(
            self.engine, self.tokenizer, problems, cfg.rollout.group_size, self.params, gen,
            tree=self.value_stage.tree, stop_ids=self.stop_ids,
        )
        ref_logp = None
        if self.ref_model is not None:
            with inference(self.device, cfg.policy.precision):
                ref_logp = response_logprobs(self.ref_model, batch)  # on the CPU, like the batch
        clock.append(time.perf_counter())
        scored = self.scorer(batch, progress=progress, generator=gen, ref_logprobs=ref_logp)
        clock.append(time.perf_counter())
        vout = self.value_stage(batch, scored.step_ends, gen)
        clock.append(time.perf_counter())
        adv, ret = stages.credit(batch, scored, cfg, values=vout.values, lam=lam, step_ends=vout.step_ends)
        clock.append(time.perf_counter())
        mask = batch.response_mask & scored.keep[:, None]
        critic = None
        policy_learner, critic_learner = self._learners()
        if critic_learner is not None:
            critic = stages.CriticTarget(critic_learner, self.value_stage.optimizer, ret, vout.member_values)
        train_policy = it >= cfg.value.warmup_iterations
        upd = stages.update(
            policy_learner, self.optimizer, batch, adv, mask, cfg, gen,
            ref_logprobs=ref_logp, critic=critic, train_policy=train_policy, scaler=self.scaler,
        )
        if self._sharded:  # every rank gathers the updated shards into its generation copy
            self.model.load_state_dict(ddp.full_state_dict(policy_learner))
        if cfg.backend.name == "ray":  # broadcast the new weights to the rollout workers
            self.engine.sync(self.model)
        clock.append(time.perf_counter())
        if ddp.is_main():  # the credit inspector's sample (train.inspect_every); outside the stage timers
            record_iteration(
                self.run_dir, it + 1, batch, scored, adv, ret, cfg, self.tokenizer, self.task,
                values=vout.values, credit_step_ends=vout.step_ends, lam=lam,
            )
        n_tokens = stages.generated_tokens(batch)
        samples, tokens = (int(x) for x in ddp.all_reduce_sum([batch.size, n_tokens]))  # over every rank
        self.totals["samples"] += samples
        self.totals["tokens"] += tokens
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
            **pass_at_k_metrics(batch.group_ids, scored.outcome),
            "train/step_accuracy": float(scored.step_correct.mean()),
            "response/length": float(batch.response_lengths.float().mean()),
            "response/truncated": float((~batch.finished).float().mean()),
            "tokens/generated": n_tokens,
            "tokens/padded": batch.size * (batch.prompt_ids.shape[1] + batch.response_ids.shape[1]),
            **masked_stats("adv", adv, mask),
            **masked_stats("return", ret, mask),
            "credit/lam": lam,
            "optim/lr": lr,
            "policy/updated": float(train_policy),
            **upd,
            **vout.stats,
        }
        if vout.values is not None:
            row.update(masked_stats("value", vout.values, mask))
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
        if cfg.backend.name == "ray":
            row.update(self.engine.stats())  # backend/restarts, time/sync_s
        return reduce_row(row, upd, batch.size, int(mask.sum()))

    def run(self) -> RLResult:
        cfg = self.cfg
        if ddp.is_main():  # data-parallel: rank 0 writes the run directory, evaluates and checkpoints
            cfg.dump(self.run_dir / "config.yaml")
        history: list[dict[str, Any]] = []
        if self.metrics_path.exists():
            history = [json.loads(x) for x in self.metrics_path.read_text().splitlines() if x.strip()]
        if self.start_iteration == 0 and not history:
            row = {"iteration": 0, "samples/total": 0, "tokens/total": 0, "time/total_s": 0.0, **self._evaluate_on_main()}
            self._log(row, history)
        bar = tqdm(
            range(self.start_iteration, cfg.train.iterations),
            initial=self.start_iteration,
            total=cfg.train.iterations,
            desc=f"rl {cfg.credit.estimator}/{cfg.reward.source}",
            disable=not cfg.train.progress or not ddp.is_main(),
            dynamic_ncols=True,
        )
        last_eval = history[-1].get("eval/accuracy") if history else None
        for it in bar:
            row = self.iteration(it)
            done = it + 1
            spent = cfg.train.max_tokens and self.totals["tokens"] >= cfg.train.max_tokens
            if done % cfg.train.eval_every == 0 or done == cfg.train.iterations or spent:
                row.update(self._evaluate_on_main())
                last_eval = row.get("eval/accuracy")
            self._log(row, history)
            if done % cfg.train.checkpoint_every == 0 or done == cfg.train.iterations or spent:
                if ddp.is_main():
                    self.save(done)
                ddp.barrier()
            bar.set_postfix(reward=f"{row['reward/mean']:.2f}", acc=f"{row['train/accuracy']:.2f}", eval=last_eval)
            if spent:  # the token budget (train.max_tokens) is used up
                break
        self.close()
        return RLResult(self.run_dir, history)

    def close(self) -> None:
        """Stop the Ray workers (backend.name=ray) and drop the data-parallel wrappers (so that
        :func:`creditrl.distributed.ddp.shutdown` can leave the process group cleanly)."""
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
        self._policy_ddp = self._critic_ddp = None

    def _log(self, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        history.append(row)
        if ddp.is_main():
            with self.metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
