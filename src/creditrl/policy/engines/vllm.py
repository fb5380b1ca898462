"""A :class:`~creditrl.policy.engines.base.GenerationEngine` backed by vLLM (``policy.engine=vllm``).

vLLM runs the policy on a CUDA GPU with paged attention, continuous batching and prefix
caching; the trainer keeps its own HF copy of the policy, updates it, and this engine pushes
the updated weights into the running vLLM engine before the next generation (:meth:`VLLMEngine.sync`,
called automatically when the HF parameters changed in place, e.g. by ``optimizer.step()``).
vLLM is imported only inside this module's functions: without vLLM or without CUDA,
building the engine raises :class:`VLLMUnavailableError` with an install hint.

The contract is the in-process engines': prompt-major samples, tokens ending with eos when
``finished``, a ``params.stop_ids`` token kept as the last token with ``finished`` False,
``budgets[i]`` capping prompt i's new tokens, greedy decoding at ``temperature == 0``, and
``logprobs`` = log pi(token) under the *raw* policy distribution (temperature 1, no top-p). How:

* **one vLLM request per sample** (each prompt repeated ``n`` times, ``SamplingParams(n=1)``):
  vLLM refuses ``n > 1`` with greedy sampling, per-request parameters carry the budgets, and
  prefix caching shares the prompt's KV blocks between the requests;
* **stopping**: ``ignore_eos=True`` and ``stop_token_ids=[eos_id, *stop_ids]``: vLLM stops on
  exactly these ids and keeps the stop token in ``token_ids``; ``finished`` = the last token is
  ``eos_id``;
* **log-probs**: ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob at every
  position, and the engine is built with ``logprobs_mode="raw_logprobs"`` (log-softmax of the
  logits before temperature and top-p);
* **seeds**: a sampling call draws one base seed from the torch ``generator`` (the global torch
  RNG when None) and gives request i ``seed = base + i``, so a run is reproducible from its seed
  (up to the floating-point effects of batch composition in vLLM's kernels). vLLM's random stream
  is not the in-process engines': the same seed gives other samples than
  :class:`~creditrl.policy.engines.hf.HFEngine` (greedy decoding agrees up to float ties). A
  greedy call draws nothing from the generator.

Weight sync (:meth:`VLLMEngine.sync`): the HF state dict (tied tensors once) is written to a
safetensors file in the engine's temporary directory and every vLLM worker loads it through the
worker extension :class:`WeightSyncExtension` (``worker_extension_cls``), which calls the model's
own ``load_weights`` (as TRL's ``vllm_serve.py`` and OpenRLHF's vLLM workers do); then the prefix
cache is reset. A file path keeps the RPC message small and independent of how vLLM serialises
tensors. A single-GPU design: for a trainer on other GPUs, vLLM's weight-transfer API (NCCL/IPC
backends) is the faster path.

Only documented vLLM APIs are used (checked against vllm==0.33.0): ``LLM``, its ``generate``
(outputs in input order), ``collective_rpc`` and ``reset_prefix_cache``, ``SamplingParams``, and
``RequestOutput``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from creditrl.policy.engines.base import Generation, SamplingParams, cut_row, expand_requests

INSTALL_HINT = (
    "policy.engine=vllm needs vLLM and a CUDA GPU: pip install 'creditrl[vllm]' (without the constraints file; "
    "vllm 0.33 brings torch 2.14 and transformers < 5.21, inside creditrl's ranges) on the GPU machine"
)
VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses temperatures above this
SEED_RANGE = 2**31 - 1
EXTENSION = "creditrl.policy.engines.vllm.WeightSyncExtension"
RPC_METHOD = "creditrl_load_weights"


class VLLMUnavailableError(RuntimeError):
    """vLLM is not installed or no CUDA device is visible."""


def vllm_unavailable_reason() -> str | None:
    """Why ``policy.engine=vllm`` cannot run here (None when it can), without importing vLLM."""
    module = sys.modules.get("vllm", ...)
    if module is None or (module is ... and importlib.util.find_spec("vllm") is None):
        return "vllm is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    return None


def unavailable_message(reason: str) -> str:
    return f"{INSTALL_HINT} ({reason})"


def require_vllm() -> Any:
    """Import and return the ``vllm`` module, or raise :class:`VLLMUnavailableError`."""
    reason = vllm_unavailable_reason()
    if reason is None:
        try:
            import vllm
        except ImportError as exc:
            reason = f"importing vllm failed: {exc}"
        else:
            return vllm
    raise VLLMUnavailableError(unavailable_message(reason))


def export_weights(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The HF state dict as contiguous CPU tensors, a tensor stored under two names (tied
    embeddings) only under its first: what :meth:`VLLMEngine.sync` sends."""
    if hasattr(model, "peft_config"):
        raise ValueError("VLLMEngine cannot run LoRA (peft) adapters; use policy.lora_r=0 with policy.engine=vllm")
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


def weights_key(model: PreTrainedModel) -> tuple:
    """Changes when ``model``'s parameters are replaced or updated in place (each parameter's
    autograd version counter counts in-place writes such as ``optimizer.step()``; writes
    through ``param.data`` are not counted: call :meth:`VLLMEngine.sync` after those)."""
    params = {id(p): p for p in model.parameters()}.values()
    return (id(model), tuple((id(p), p.data_ptr(), p._version) for p in params))


class WeightSyncExtension:
    """vLLM worker extension (``worker_extension_cls``): its methods become methods of every
    vLLM GPU worker and run there through ``LLM.collective_rpc``."""

    def creditrl_load_weights(self, path: str) -> list[str]:
        """Load the safetensors file at ``path`` (HF parameter names) into the worker's model;
        returns the names of the parameters vLLM loaded (its own, e.g. fused ``qkv_proj``)."""
        from safetensors.torch import load_file

        weights = load_file(path, device="cpu")
        loaded = self.model_runner.model.load_weights(weights=list(weights.items()))  # type: ignore[attr-defined]
        return sorted(loaded) if loaded is not None else sorted(weights)


@dataclass
class _Backend:
    """One running ``vllm.LLM`` and what it holds; shared by the engines :func:`make_engine`
    builds for models of one architecture (one vLLM instance per GPU process)."""

    llm: Any
    workdir: tempfile.TemporaryDirectory
    loaded: tuple | None  # (weakref, weights_key) of the HF model whose weights the LLM holds
    syncs: int = 0


_SHARED: dict[tuple, _Backend] = {}


def reset_shared() -> None:
    """Forget the shared vLLM instances (tests; frees them once nothing else holds them)."""
    _SHARED.clear()


def _architecture(model: PreTrainedModel) -> str:
    """The model's config as JSON, without the fields ``save_pretrained`` fills in."""
    config = {
        k: v
        for k, v in model.config.to_dict().items()
        if k not in ("architectures", "dtype", "torch_dtype", "transformers_version", "_name_or_path")
    }
    return json.dumps(config, sort_keys=True, default=str)


def _model_dtype(model: PreTrainedModel) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


class VLLMEngine:
    """Sampling through vLLM (see the module docstring).

    ``model_path``: a directory vLLM loads (``config.json`` + weights); when None, ``model`` is
    saved to a temporary directory first. ``model``: the trainer's HF policy, whose weights
    :meth:`sync` pushes (automatically before a generate after they changed, ``auto_sync``);
    when both are given the first generate syncs ``model``'s weights, so the directory only
    needs the right architecture. ``dtype`` (default: ``model``'s, else ``auto``),
    ``gpu_memory_utilization``, ``enable_prefix_caching``, ``enforce_eager``, ``max_model_len``
    and ``llm_kwargs`` (any other ``vllm.LLM`` argument) configure the vLLM instance.
    ``seeded=False`` sends no per-request seeds (vLLM then samples from its engine-wide RNG,
    seeded by ``seed``: faster where vLLM's sampler handles seeded requests one by one, but the
    samples then depend on how requests are batched). ``share=True`` reuses one instance per
    (architecture, options) within the process.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        eos_id: int,
        pad_id: int,
        model: PreTrainedModel | None = None,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.5,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
        seed: int = 0,
        auto_sync: bool = True,
        seeded: bool = True,
        share: bool = False,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if model_path is None and model is None:
            raise ValueError("VLLMEngine needs model_path, model, or both")
        if model is not None and hasattr(model, "peft_config"):
            raise ValueError("VLLMEngine cannot run LoRA (peft) adapters; use policy.lora_r=0 with policy.engine=vllm")
        dtype = dtype or (_model_dtype(model) if model is not None else "auto")
        if dtype not in VLLM_DTYPES:
            raise ValueError(f"VLLMEngine dtype: expected one of {VLLM_DTYPES}, got '{dtype}'")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        vllm = require_vllm()
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.auto_sync = auto_sync
        self.seeded = seeded
        self.model = model  # whose weights sync sends; a new object (a resumed run) is synced before generating
        self.sync_s = 0.0
        options = dict(
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            seed=seed,
            skip_tokenizer_init=True,  # prompts are token ids and outputs are not detokenized
            logprobs_mode="raw_logprobs",
            worker_extension_cls=EXTENSION,
        )
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        options.update(llm_kwargs or {})
        arch = str(Path(model_path).resolve()) if model_path is not None else _architecture(model)
        key = (arch, tuple(sorted((k, repr(v)) for k, v in options.items())))
        backend = _SHARED.get(key) if share else None
        if backend is None:
            workdir = tempfile.TemporaryDirectory(prefix="creditrl-vllm-")
            if model_path is None:
                path = str(Path(workdir.name) / "model")
                model.save_pretrained(path, safe_serialization=True)
                loaded = (weakref.ref(model), weights_key(model))
            else:
                path, loaded = str(model_path), None
            llm = vllm.LLM(model=path, **options)
            backend = _Backend(llm=llm, workdir=workdir, loaded=loaded)
            if share:
                _SHARED[key] = backend
        self.backend = backend

    @property
    def llm(self) -> Any:
        return self.backend.llm

    @property
    def stale(self) -> bool:
        """Whether vLLM holds other weights than ``model`` has now."""
        if self.model is None:
            return False
        loaded = self.backend.loaded
        return loaded is None or loaded[0]() is not self.model or loaded[1] != weights_key(self.model)

    def sync(self, model: PreTrainedModel | None = None) -> int:
        """Push ``model``'s (default: ``self.model``'s) current weights into the running vLLM
        engine and reset its prefix cache; returns the number of syncs so far."""
        start = time.perf_counter()
        if model is not None:
            self.model = model
        if self.model is None:
            raise ValueError("VLLMEngine.sync: no model to take the weights from")
        from safetensors.torch import save_file

        b = self.backend
        path = Path(b.workdir.name) / f"sync_{b.syncs:06d}.safetensors"
        save_file(export_weights(self.model), str(path))
        try:
            results = b.llm.collective_rpc(RPC_METHOD, args=(str(path),))
        finally:
            path.unlink(missing_ok=True)
        if not results or any(not r for r in results):
            raise RuntimeError(f"vLLM workers loaded no weights from {path.name}: {results!r}")
        b.llm.reset_prefix_cache()
        b.loaded = (weakref.ref(self.model), weights_key(self.model))
        b.syncs += 1
        self.sync_s += time.perf_counter() - start
        return b.syncs

    def stats(self) -> dict[str, float]:
        """Per-iteration metrics: seconds spent in weight sync since the last call."""
        out = {"time/sync_s": self.sync_s}
        self.sync_s = 0.0
        return out

    def sampling_params(
        self, params: SamplingParams, limits: Sequence[int], generator: torch.Generator | None
    ) -> list[Any]:
        """One ``vllm.SamplingParams`` per request (see the module docstring)."""
        from vllm import SamplingParams as VSamplingParams

        if params.temperature > VLLM_MAX_TEMPERATURE:
            raise ValueError(
                f"VLLMEngine: vLLM accepts temperature in [0, {VLLM_MAX_TEMPERATURE}], got {params.temperature}"
            )
        greedy = params.temperature == 0
        seeded = self.seeded and not greedy
        base = int(torch.randint(0, SEED_RANGE, (1,), generator=generator).item()) if seeded else 0
        stop = list(dict.fromkeys([self.eos_id, *params.stop_ids]))
        return [
            VSamplingParams(
                n=1,
                temperature=0.0 if greedy else params.temperature,
                top_p=1.0 if greedy else params.top_p,
                max_tokens=int(limit),
                logprobs=0,
                stop_token_ids=stop,
                ignore_eos=True,
                seed=base + i if seeded else None,
                detokenize=False,
            )
            for i, limit in enumerate(limits)
        ]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        budgets: Sequence[int] | None = None,
    ) -> Generation:
        requests, limit = expand_requests(prompts, n, params, budgets)
        if self.auto_sync and self.stale:
            self.sync()
        limits = limit.tolist()
        outputs = self.llm.generate(
            [{"prompt_token_ids": r} for r in requests],
            sampling_params=self.sampling_params(params, limits, generator),
            use_tqdm=False,
        )
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
        rows = []
        for i, (request, out, cap) in enumerate(zip(requests, outputs, limits)):
            if list(out.prompt_token_ids) != request:
                raise RuntimeError(f"vLLM output {i} answers another prompt than request {i}")
            if len(out.outputs) != 1:
                raise RuntimeError(f"vLLM output {i}: expected one completion, got {len(out.outputs)}")
            completion = out.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            if completion.logprobs is None or len(completion.logprobs) != len(ids):
                raise RuntimeError(f"vLLM output {i}: no log-prob for every token")
            lps = [_sampled_logprob(completion.logprobs[t], tok, i) for t, tok in enumerate(ids)]
            # vLLM stops exactly there; the cut only guards the contract
            rows.append(cut_row(ids, lps, cap, self.eos_id, params.stop_ids))
        return Generation.prompt_major(len(prompts), n, requests, *map(list, zip(*rows)))


def _sampled_logprob(position: Mapping[int, Any], token: int, request: int) -> float:
    """The log-prob of ``token`` in one position's ``{token_id: Logprob}`` dict."""
    try:
        entry = position[token]
    except KeyError:
        raise RuntimeError(f"vLLM output {request}: no log-prob for sampled token {token}") from None
    return float(getattr(entry, "logprob", entry))
