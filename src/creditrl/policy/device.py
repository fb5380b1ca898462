"""Where the models run and in which arithmetic: ``policy.device`` and ``policy.precision``.

The policy, the reference policy and the critic live on ``policy.device`` (under ``torchrun``,
``cuda`` means ``cuda:LOCAL_RANK``); every model-side function moves a batch to its module's
device on entry and hands CPU tensors back, so rewards, credit and metrics stay on the CPU.
Under ``policy.precision`` ``bf16`` or ``fp16`` the weights and the optimizer state stay in
``policy.dtype`` (the master copy) and every forward pass runs under ``torch.autocast``, with
log-softmax in float32; ``fp16`` adds dynamic loss scaling (``torch.amp.GradScaler``, checkpointed).

Sampling and training forwards differ in rounding under mixed precision, so by default
(``loss.recompute_logprobs=auto``) the update recomputes the old policy's log-probs with its own
forward instead of trusting the sampler's; the gap is logged as ``policy/sampler_logprob_gap``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

# autocast dtype of each policy.precision (the names are the config's Precision; a test keeps them equal)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """The torch device ``policy.device`` names; ValueError for a malformed name or a GPU that
    torch cannot see (the message says which)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(
                f"policy.device: '{name}' but torch sees no CUDA device (torch {torch.__version__}, "
                f"cuda build: {torch.version.cuda or 'none'}); use policy.device=cpu or auto"
            )
        if name == "cuda":  # under torchrun each rank takes its node-local GPU
            local = os.environ.get("LOCAL_RANK")
            name = f"cuda:{int(local) if local is not None else torch.cuda.current_device()}"
        index = int(name[5:])
        if index >= torch.cuda.device_count():
            raise ValueError(f"policy.device: '{name}' but torch sees {torch.cuda.device_count()} CUDA device(s)")
        return torch.device(name)
    raise ValueError(f"policy.device: expected cpu, cuda, cuda:N or auto, got '{name}'")


def check_precision(precision: str, device: torch.device) -> None:
    """ValueError unless ``precision`` is known and the device can run it."""
    if precision not in PRECISIONS:
        raise ValueError(f"policy.precision: expected one of {', '.join(PRECISIONS)}, got '{precision}'")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"policy.precision: bf16 is not supported on {torch.cuda.get_device_name(device)}; use fp16")


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``precision`` on ``device``'s type; a no-op for fp32."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (the CPU for a module without parameters)."""
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """Dynamic loss scaling for fp16 (None otherwise): fp16's 5 exponent bits underflow small
    gradients, bf16 has float32's exponent range and needs none."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


@contextlib.contextmanager
def inference(device: torch.device | str, precision: str) -> Iterator[None]:
    """``torch.no_grad()`` under :func:`autocast`: the context of every forward pass that is
    not differentiated (generation, reference log-probs, critic values, evaluation)."""
    with torch.no_grad(), autocast(device, precision):
        yield


def is_fsdp(module: torch.nn.Module) -> bool:
    """Whether ``module`` is or holds an FSDP2-sharded module (it all-gathers weights in every call):
    a sharded critic's backbone holds its sharded blocks although its own root is not sharded."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())
