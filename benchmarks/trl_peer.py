"""The TRL peer of the speed benchmark: TRL's ``GRPOTrainer`` on creditrl's model and task.

:func:`trl_grpo_run` runs TRL's GRPO on creditrl's model and task at the settings of one creditrl
``grpo`` iteration (``prompts_per_iter`` prompts x ``group_size`` samples, one optimizer step on
all of them, token-mean PPO-clip loss, no KL) and times every optimizer step.
(The decode baseline, plain HF ``generate``, is `hf_peer.py`.)

``trl`` is an optional dependency (``pip install 'creditrl[bench]'``): it is imported inside the
functions only.

What is matched (TRL 1.16.0, transformers 5.24.0; every item read in the installed source)
----------------------------------------------------------------------------------------
* Prompts: iteration ``i`` trains on ``task.sample(prompts_per_iter, split="train",
  seed=iteration_seed(settings.seed, i))``, exactly the problems of creditrl's iteration ``i``
  (:func:`creditrl.train.rl.iteration_seed`), fed in that order (``shuffle_dataset=False``:
  ``RepeatSampler`` then yields ``range(n)``, each index ``num_generations`` times in a row). The
  char tokenizer adds no special tokens itself (``tokenizer("7+3=")`` has no bos) while
  :func:`creditrl.policy.tokenizer.encode_prompt` prepends bos, so the text given to TRL is
  ``tokenizer.bos_token + prompt``; :func:`trl_prompt_text` checks that it tokenizes to exactly
  the ``encode_prompt`` ids and raises otherwise.
* Reward: ``task.check_outcome`` on ``decode_response(tokenizer, completion_ids)`` -> 1.0/0.0,
  the ``outcome`` source of :mod:`creditrl.rewards.sources`. TRL's completion ids run up to and
  including the first eos, as creditrl's engine returns them.
* Advantage (``scale_rewards="group"``, one reward function, ``sum_then_normalize``):
  ``(r - mean_g r) / (std_g r + eps)`` with TRL's ``nanstd``, the Bessel-corrected (n - 1)
  standard deviation, the same std as creditrl's ``group_std``. A group of equal rewards gets 0
  in both (TRL: 0 / (0 + eps)).
* Loss: ``loss_type="dapo"``: ``sum(per_token_loss * mask) / num_items_in_batch`` with
  ``num_items_in_batch`` = completion tokens of the whole generation batch (times
  ``grad_accum / steps_per_generation`` = 1): creditrl's ``token-mean``. Per token
  ``-min(r A, clip(r, 1 - eps, 1 + eps) A)`` with ``epsilon_high = epsilon = clip_eps``, creditrl's
  ``ppo_clip_loss``. The loss mask covers the completion up to and including eos; truncated
  completions stay in (``mask_truncated_completions=False``), as in creditrl. ``beta=0``: no
  reference model, no KL; ``entropy_coef=0``; ``top_entropy_quantile=1``; token-level ratios.
* Sampling: ``do_sample=True``, ``temperature``, ``top_p=1.0``, ``top_k=0``, ``min_p=None``,
  ``repetition_penalty=1.0``. On top_k: HF's ``_prepare_generation_config`` fills only ``None``
  fields with its global defaults (which hold ``top_k=50``); TRL sets ``top_k=0`` explicitly, so
  it survives, and ``_get_logits_processor`` adds ``TopKLogitsWarper`` only when
  ``top_k not in (None, 0)``: no top-k truncation, as in creditrl's engine. (A caller that left
  ``top_k=None`` would silently get top-50.)
* Optimisation: ``optim="adamw_torch"`` (plain ``torch.optim.AdamW``, like creditrl; the
  transformers default for torch >= 2.8 is the fused kernel), betas ``(0.9, adam_beta2=0.99)`` and
  eps 1e-8 as in creditrl's ``RLTrainer`` (TrainingArguments' default beta2 is 0.999),
  ``weight_decay=0``; ``max_grad_norm`` clipping through ``torch.nn.utils.clip_grad_norm_``;
  constant lr, no warm-up; ``activation_checkpointing=False`` (TRL's default for the
  deprecated alias ``gradient_checkpointing`` is True), fp32
  (``bf16=False``; TRL's default is bf16 on), CPU (``use_cpu=True``); ``PeerSettings.device`` and
  ``precision`` set ``use_cpu`` and ``bf16`` for a GPU run (bf16 = autocast over float32 weights, as
  creditrl's ``policy.precision=bf16``).

Where TRL's GRPO still differs from creditrl's ``grpo`` + token-mean PPO loss
---------------------------------------------------------------------------
1. Advantage epsilon: TRL divides by ``std + 1e-4``; creditrl by ``std + 1e-6`` (``EPS``). For 0/1
   rewards in a mixed group of 8 the std is >= 0.35, so TRL's advantages are smaller by a
   relative <= 3e-4.
2. Old log-probs: with ``num_iterations=1`` and ``steps_per_generation == grad_accum == 1`` TRL
   computes no old log-probs (``old_per_token_logps=None``) and uses
   ``per_token_logps.detach()``, so the ratio is exactly 1 and the step is the plain policy
   gradient. creditrl's old log-probs come from its sampling engine (KV-cache decoding), so its
   ratio is 1 only up to float rounding between the cached and the full forward pass. Clipping
   is inactive in both; gradients agree to rounding. Neither runs an extra no-grad forward
   pass for old log-probs (TRL skips it; creditrl's engine returns them while sampling).
3. Temperature in the loss: TRL's fused LM head divides the logits by ``temperature`` before the
   log-softmax (``add_fused_lm_head(temperature=args.temperature)``), i.e. it trains the
   tempered policy; creditrl's loss uses raw logits at any sampling temperature. Identical at
   temperature 1.0 (the default here); they differ for any other temperature.
4. Position ids in the loss forward: HF ``generate`` derives position ids from the attention mask
   (0 at a row's first real token), as creditrl does everywhere; TRL's loss forward calls the
   backbone with ``input_ids`` and ``attention_mask`` only, so a left-padded row's positions are
   shifted by its pad count. The tiny model is a Llama with RoPE only (no absolute position
   embedding), so attention depends on relative positions and the difference is float rounding.
5. Random streams: TRL samples from the global torch RNG (``set_seed(seed)`` at init, again with
   ``device_specific=True``); creditrl from a per-iteration ``torch.Generator``. The prompts are
   the same but the completions, hence the rewards, are different draws: compare rewards in
   distribution, not per iteration.
6. Decoding engine (speed, not distribution): HF ``generate`` keeps finished rows in the batch,
   padding them, until every row has finished or hit ``max_new_tokens``; creditrl's engine drops
   a finished row's cache rows. TRL also computes the per-token entropy in the loss forward (for
   logging); creditrl computes its entropy for logging too.
7. Generation runs in ``model.train()`` mode in TRL (creditrl switches to eval): no effect on a
   Llama, whose attention dropout is 0 and which has no other dropout.
8. Per-step work outside the policy update: TRL also steps an LR scheduler (constant) and logs
   metrics (``.item()`` syncs); creditrl's iteration also runs its (empty) value stage and its
   scorer. Both are small next to generation and backward.

Timing and reward bookkeeping
-----------------------------
A :class:`transformers.TrainerCallback` takes ``time.perf_counter()`` at ``on_step_begin`` and
``on_step_end``. In transformers 5.24's training loop that window holds ``training_step`` (TRL's
``_prepare_inputs``: generation, reward, advantages; then the loss forward and backward), grad
clipping, the optimizer step, the scheduler step and ``zero_grad``. Outside it: fetching the
step's dataset rows (before ``on_step_begin``) and TRL's logging (after ``on_step_end``).

The per-iteration reward is the mean of the rewards our reward function returned in its call for
that step: with ``steps_per_generation=1`` and no evaluation TRL calls it exactly once per
optimizer step, in order, and the call count is checked. It is cross-checked against TRL's own
log key ``"reward"`` (``_metrics["train"]["reward"]``: ``nanmean`` of the weighted reward sum,
logged every step with ``logging_steps=1``); a mismatch raises.
"""

from __future__ import annotations

import contextlib
import logging
import random
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from creditrl.policy.tokenizer import decode_response, encode_prompt
from creditrl.tasks.base import Problem, Task
from trl_config import PeerSettings, grpo_config

__all__ = [
    "PeerSettings",
    "trl_grpo_run",
    "trl_prompt_text",
    "peer_problems",
    "make_outcome_reward",
]

_INSTALL_HINT = "pip install 'creditrl[bench]'"


def _import_trl() -> Any:
    try:
        import trl  # noqa: F401
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
    except ImportError as err:  # trl, or one of its own dependencies (accelerate, datasets)
        raise ImportError(
            f"the TRL peer benchmark needs trl and its dependencies (missing: {err.name or err}); "
            f"install them with: {_INSTALL_HINT}"
        ) from err
    return trl


def trl_prompt_text(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """The text to give TRL for ``prompt`` so that TRL's tokenization (``tokenizer(text=...)``,
    special tokens on) yields exactly ``encode_prompt(tokenizer, prompt)``.

    A tokenizer that adds bos itself gets the prompt as is; one that adds nothing (creditrl's
    char tokenizer) gets ``tokenizer.bos_token + prompt``. Raises ValueError when neither works.
    """
    target = encode_prompt(tokenizer, prompt)
    candidates = [prompt]
    if tokenizer.bos_token is not None:
        candidates.append(tokenizer.bos_token + prompt)
    for text in candidates:
        if list(tokenizer(text=text)["input_ids"]) == target:
            return text
    raise ValueError(
        f"no prompt text makes this tokenizer produce creditrl's prompt ids {target} for {prompt!r} "
        f"(tried {candidates!r})"
    )


def peer_problems(task: Task, iterations: int, settings: PeerSettings) -> list[Problem]:
    """The training problems of ``iterations`` creditrl iterations, in order: iteration ``i``'s
    ``prompts_per_iter`` problems are ``task.sample(..., split="train", seed=iteration_seed(seed, i))``."""
    from creditrl.train.rl import iteration_seed

    problems: list[Problem] = []
    for it in range(iterations):
        problems += task.sample(settings.prompts_per_iter, split="train", seed=iteration_seed(settings.seed, it))
    return problems


def make_outcome_reward(tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem]) -> Any:
    """TRL reward function: 1.0 where ``task.check_outcome`` accepts the decoded completion, else 0.0.

    It reads the dataset column ``problem_index`` (an index into ``problems``) and TRL's
    ``completion_ids`` (decoded with creditrl's :func:`decode_response`). Every call's rewards are
    appended to the function's ``calls`` attribute, and every call's number of completion tokens
    (each completion up to and including its first eos) to its ``tokens`` attribute.
    """
    calls: list[list[float]] = []
    tokens: list[int] = []

    def outcome(
        prompts: list, completions: list, completion_ids: list[list[int]], problem_index: list[int], **_: Any
    ) -> list[float]:
        rewards = [
            1.0 if task.check_outcome(problems[i], decode_response(tokenizer, list(ids))) else 0.0
            for i, ids in zip(problem_index, completion_ids, strict=True)
        ]
        calls.append(rewards)
        tokens.append(sum(len(ids) for ids in completion_ids))
        return rewards

    outcome.calls = calls  # type: ignore[attr-defined]
    outcome.tokens = tokens  # type: ignore[attr-defined]
    return outcome


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class _StepTimer(TrainerCallback):
    """Wall time of every optimizer step, from ``on_step_begin`` to ``on_step_end``."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start: float | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _synchronize()
        self._start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._start is not None:
            _synchronize()  # the step's queued GPU work belongs to it
            self.times.append(time.perf_counter() - self._start)
            self._start = None


@contextlib.contextmanager
def _quiet_and_isolated() -> Iterator[None]:
    """Silence transformers/TRL/accelerate info logging and keep the caller's global RNG states
    (the Trainer calls ``set_seed``)."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    loggers = [logging.getLogger(name) for name in ("trl", "accelerate", "transformers")]
    levels = [lg.level for lg in loggers]
    py_state, np_state = random.getstate(), np.random.get_state()
    transformers.logging.set_verbosity_error()
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            # transformers 5.24 deprecates the gradient_checkpointing names that TRL 1.16 still uses
            warnings.filterwarnings(
                "ignore", message=".*deprecated and will be removed in v6.*", category=FutureWarning
            )
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        random.setstate(py_state)
        np.random.set_state(np_state)


def _build_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    iterations: int,
    settings: PeerSettings,
    output_dir: str,
) -> tuple[Any, Any, _StepTimer]:
    """A ready GRPOTrainer (not yet trained), its reward function and its step timer."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    problems = peer_problems(task, iterations, settings)
    dataset = Dataset.from_dict(
        {
            "prompt": [trl_prompt_text(tokenizer, p.prompt) for p in problems],
            "problem_index": list(range(len(problems))),
        }
    )
    reward = make_outcome_reward(tokenizer, task, problems)
    timer = _StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=grpo_config(output_dir, iterations, settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    # disable_tqdm swaps the progress bar for PrinterCallback, which prints every log dict
    trainer.remove_callback(PrinterCallback)
    return trainer, reward, timer


def trl_grpo_run(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    iterations: int,
    settings: PeerSettings,
) -> list[dict]:
    """Run TRL GRPOTrainer for ``iterations`` optimizer steps; one step = prompts_per_iter prompts x
    group_size completions, one optimizer step over all of them (num_iterations=1,
    steps_per_generation=1, gradient accumulation 1), beta=0 (no reference model),
    loss_type='dapo' (token mean over the batch), scale_rewards='group', constant lr with no
    warm-up, AdamW (betas (0.9, settings.adam_beta2), as creditrl), max_grad_norm=grad_clip,
    ``settings.device`` (use_cpu for "cpu") and ``settings.precision`` (TRL's bf16 flag: autocast,
    float32 weights), report_to none, no saving, no eval.

    ``model`` is trained in place (pass a copy); TRL also patches its ``forward`` with a fused LM
    head, which is removed again afterwards. TRL writes only into a temporary directory, removed
    on return. The caller's global RNG states (python, numpy, torch CPU) are restored.

    Returns one dict per iteration: ``{"iteration": i, "time_s": wall seconds of that training
    step (generation + scoring + loss forward + backward + optimizer step), "reward": mean
    outcome reward of the iteration's completions, "tokens": completion tokens generated in that
    step (each completion up to and including its first eos)}`` (see the module docstring for how
    each is measured).
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    _import_trl()
    had_forward = "forward" in vars(model)
    with _quiet_and_isolated(), tempfile.TemporaryDirectory(prefix="creditrl-trl-") as out:
        trainer, reward, timer = _build_trainer(model, tokenizer, task, iterations, settings, out)
        try:
            trainer.train()
        finally:
            if not had_forward and "forward" in vars(model):
                del model.forward  # drop TRL's fused-LM-head patch: back to the class's forward
        logged = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    calls: list[list[float]] = reward.calls
    if len(calls) != iterations or len(timer.times) != iterations:
        raise RuntimeError(
            f"expected {iterations} steps, got {len(timer.times)} timed steps and {len(calls)} reward calls"
        )
    rewards = [sum(c) / len(c) for c in calls]
    if len(logged) == iterations and any(abs(a - b) > 1e-5 for a, b in zip(rewards, logged)):
        raise RuntimeError(f"reward bookkeeping mismatch: reward calls {rewards} vs TRL logs {logged}")
    return [
        {"iteration": i, "time_s": t, "reward": r, "tokens": n}
        for i, (t, r, n) in enumerate(zip(timer.times, rewards, reward.tokens))
    ]
