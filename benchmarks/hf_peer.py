"""The decode baseline of the speed benchmark: one call of HF ``model.generate``."""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import PreTrainedModel

from creditrl.policy.engines import left_pad

__all__ = ["hf_generate_throughput"]


@torch.no_grad()
def hf_generate_throughput(
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    n: int,
    max_new_tokens: int,
    *,
    temperature: float,
    pad_id: int,
    eos_id: int | None,
    seed: int,
) -> dict:
    """One call of ``model.generate`` on the left-padded batch (each prompt repeated ``n`` times,
    with its attention mask), sampling (``do_sample=True, top_k=0, top_p=1.0``).

    With ``eos_id=None`` generation runs to ``max_new_tokens`` (``min_new_tokens =
    max_new_tokens``, which also masks any eos the model's generation config declares). Returns
    ``{"time_s", "new_tokens", "tokens_per_s"}``; ``new_tokens`` counts each row's generated
    tokens up to and including its first eos (all of them when it has none). The count goes by
    position, not by pad id: an untrained model may sample the pad id as an ordinary token.
    The caller's torch RNG state is restored; the model's train/eval mode too.
    """
    if n < 1 or not prompt_ids or max_new_tokens < 1:
        raise ValueError(f"need prompts, n >= 1 and max_new_tokens >= 1 (got {len(prompt_ids)}, {n}, {max_new_tokens})")
    if temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0, got {temperature}")
    requests = [list(p) for p in prompt_ids for _ in range(n)]
    ids, attn = left_pad(requests, pad_id)
    device = next(model.parameters()).device
    ids, attn = ids.to(device), attn.to(device)
    kwargs: dict[str, Any] = {
        "do_sample": True,
        "temperature": temperature,
        "top_k": 0,
        "top_p": 1.0,
        "max_new_tokens": max_new_tokens,
        "pad_token_id": pad_id,
    }
    if eos_id is None:
        kwargs["min_new_tokens"] = max_new_tokens
    else:
        kwargs["eos_token_id"] = eos_id
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
            torch.manual_seed(seed)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=attn, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
    finally:
        model.train(was_training)
    new = out[:, ids.shape[1] :].tolist()
    total = 0
    for row in new:
        total += row.index(eos_id) + 1 if eos_id is not None and eos_id in row else len(row)
    return {"time_s": elapsed, "new_tokens": total, "tokens_per_s": total / elapsed if elapsed > 0 else float("inf")}
