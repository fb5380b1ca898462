"""The policy optimizers a config can name (``optim.name``), registered by name, and the step
that backpropagates, clips and steps under optional fp16 loss scaling."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from creditrl.config import OptimConfig


def _adamw(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW(lr, (beta1, beta2), eps, weight_decay). Its per-coordinate normalisation moves every
    weight by about lr per step, even where the gradient is only sampling noise; a larger ``eps``
    (near the gradients' per-coordinate scale) makes such coordinates move less."""
    return torch.optim.AdamW(
        params, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, weight_decay=optim.weight_decay
    )


def _sgd(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """Heavy-ball SGD(lr, momentum, weight_decay), whose step is proportional to the gradient."""
    return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay)


OPTIMIZERS: dict[str, Callable[[Iterable[torch.nn.Parameter], OptimConfig], torch.optim.Optimizer]] = {
    "adamw": _adamw,
    "sgd": _sgd,
}


def make_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer ``optim.name`` names, over ``params`` (the name is checked when a run is resolved)."""
    return OPTIMIZERS[optim.name](params, optim)


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    (loss if scaler is None else scaler.scale(loss)).backward()


def clip_and_step(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float, scaler: torch.amp.GradScaler | None
) -> float:
    """Clip the (unscaled) gradient norm and step; returns the norm before clipping. With fp16
    loss scaling a step whose gradients overflowed is skipped (and the scale lowered)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = float(torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm))
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
    return norm
