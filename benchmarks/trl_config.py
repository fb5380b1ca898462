"""The settings of one GRPO iteration shared by creditrl and its TRL peer, and the ``GRPOConfig`` that
makes TRL's ``GRPOTrainer`` run exactly them (`trl_peer.py` documents every matched
item and every remaining difference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PeerSettings", "grpo_config"]


@dataclass
class PeerSettings:
    """Settings of one GRPO iteration, shared by creditrl and the peers."""

    prompts_per_iter: int = 16
    group_size: int = 8
    max_new_tokens: int = 48
    temperature: float = 1.0
    lr: float = 5e-5
    clip_eps: float = 0.2
    grad_clip: float = 1.0
    seed: int = 0
    adam_beta2: float = 0.99  # creditrl's RLTrainer uses AdamW(betas=(0.9, 0.99)); HF's default is 0.999
    device: str = "cpu"  # "cpu" (TRL's use_cpu) or "cuda" (the accelerator TRL's Trainer picks)
    precision: str = "fp32"  # "fp32" or "bf16": TRL's bf16 flag, autocast over float32 weights (policy.precision)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"PeerSettings.device: expected cpu or cuda, got '{self.device}'")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"PeerSettings.precision: expected fp32 or bf16, got '{self.precision}'")


def grpo_config(output_dir: str, iterations: int, settings: PeerSettings) -> Any:
    from trl import GRPOConfig

    batch = settings.prompts_per_iter * settings.group_size
    return GRPOConfig(
        output_dir=output_dir,
        # one optimizer step = one generation batch of prompts_per_iter x group_size completions
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=settings.group_size,
        num_iterations=1,
        max_steps=iterations,
        shuffle_dataset=False,
        seed=settings.seed,
        # sampling
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        use_vllm=False,
        pad_to_multiple_of=None,
        # objective
        beta=0.0,
        epsilon=settings.clip_eps,
        epsilon_high=None,
        loss_type="dapo",
        scale_rewards="group",
        importance_sampling_level="token",
        mask_truncated_completions=False,
        top_entropy_quantile=1.0,
        entropy_coef=0.0,
        # optimizer
        learning_rate=settings.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=settings.adam_beta2,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=settings.grad_clip,
        # machinery
        use_cpu=settings.device == "cpu",
        bf16=settings.precision == "bf16",
        fp16=False,
        activation_checkpointing=False,  # (the deprecated alias gradient_checkpointing defaults to True in TRL)
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
