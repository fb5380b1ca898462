"""The Ray backend (``backend.name=ray``): rollout and scoring workers as Ray actors, the
learner on the driver.

* :class:`RayEngine` implements :class:`~creditrl.policy.engines.base.GenerationEngine`, so rollouts,
  MC value continuations and tree rollouts all run on the workers. The ``N = len(prompts) * n``
  request rows are split into contiguous chunks, one per rollout worker; each worker runs the
  in-process engine (``policy.engine``) on its own policy copy with ``draw_rows=(offset, N)``
  from the driver generator's state, and the driver then advances its generator as the
  in-process engine would have (:func:`~creditrl.policy.engines.base.advance_generator`). A run
  thus samples the same tokens as a one-process run, with log-probs equal up to float rounding
  (a chunk's forward is a smaller matrix product).
* :meth:`RayEngine.sync` broadcasts the driver's weights after each update: one ``ray.put``
  (a LoRA policy is merged into plain weights first), loaded by every worker with a version
  number that each generate call checks.
* A worker that dies (:class:`ray.exceptions.RayActorError`) is replaced by a fresh actor that
  loads the current weights, and its chunk is re-issued with the same generator state and draw
  rows, so no sample changes, is lost or is duplicated; after ``backend.max_restarts``
  replacements of one worker the run fails naming it.
* Scoring workers (``backend.score_workers > 0``, :mod:`creditrl.distributed.ray_score`) run
  the reward source over chunks of the batch under the same error policy.

``ray`` is an optional extra (``pip install 'creditrl[ray]'``) imported only here.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from creditrl.config import Config
from creditrl.distributed.workers import WorkerPool, ensure_ray, split_rows
from creditrl.policy.engines import Generation, SamplingParams, advance_generator, choose_engine, expand_requests
from creditrl.policy.model import is_lora, load_policy, policy_options


def policy_weights(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The weights a worker loads: the plain state dict, or for a LoRA policy the base weights
    with the adapters merged in (the driver's model is left untouched)."""
    if is_lora(model):
        model = copy.deepcopy(model).merge_and_unload()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def engine_kind(model: PreTrainedModel, kind: str) -> str:
    """The engine the in-process run would use for ``model`` (``auto`` resolved): workers run
    the same one on their plain copy."""
    return choose_engine(model, kind)[0]


class RolloutWorker:
    """A Ray actor (wrapped by :class:`RayEngine`): a policy copy and its in-process engine
    (``kind``: the driver's resolved ``policy.engine``)."""

    def __init__(self, cfg: Config, init_path: str, kind: str, eos_id: int, pad_id: int) -> None:
        from creditrl.policy.engines import make_engine

        torch.set_num_threads(cfg.backend.worker_threads)
        model, _ = load_policy(init_path, seed=cfg.policy.init_seed, **policy_options(cfg))
        if is_lora(model):  # the driver sends merged weights
            model = model.merge_and_unload()
        self.model = model.eval().requires_grad_(False)
        self.engine = make_engine(self.model, eos_id=eos_id, pad_id=pad_id, kind=kind, kernels=cfg.policy.kernels)
        self.version = 0
        self.calls = 0
        self.crash_at: int | None = None

    def load(self, state: dict[str, torch.Tensor], version: int) -> int:
        self.model.load_state_dict(state)
        self.version = version
        return version

    def generate(
        self,
        version: int,
        requests: list[list[int]],
        limits: list[int],
        params: SamplingParams,
        generator_state: torch.Tensor,
        draw_rows: tuple[int, int],
    ) -> tuple[list, list, list]:
        self.calls += 1
        if self.crash_at is not None and self.calls >= self.crash_at:
            os._exit(1)  # the fault-injection hook of the tests: die like a lost node
        if version != self.version:
            raise RuntimeError(f"rollout worker holds weights version {self.version}, the driver expects {version}")
        gen = torch.Generator().set_state(generator_state)
        out = self.engine.generate(requests, 1, params, generator=gen, budgets=limits, draw_rows=draw_rows)
        return out.tokens, out.logprobs, out.finished

    def crash_on_call(self, k: int) -> None:
        """Test hook: exit the process at the start of the k-th generate call from now."""
        self.crash_at = self.calls + k

    def info(self) -> dict[str, int]:
        return {"pid": os.getpid(), "version": self.version, "calls": self.calls, "threads": torch.get_num_threads()}


class RayEngine:
    """A :class:`~creditrl.policy.engines.base.GenerationEngine` over ``backend.rollout_workers``
    Ray actors (module docstring). ``model`` is the driver's policy, whose weights
    :meth:`sync` sends; assigning ``engine.model`` (a resumed run) marks them to be sent before
    the next generate."""

    def __init__(self, cfg: Config, init_path: str, model: PreTrainedModel, *, eos_id: int, pad_id: int) -> None:
        b = cfg.backend
        self.ray, self.started_ray = ensure_ray(b)
        ray = self.ray
        self.kind = engine_kind(model, cfg.policy.engine)
        self.eos_id, self.pad_id, self.threads = eos_id, pad_id, b.worker_threads
        worker = ray.remote(num_cpus=b.worker_threads, max_restarts=0)(RolloutWorker)
        args = (cfg, init_path, self.kind, eos_id, pad_id)
        self.pool = WorkerPool(
            ray, "rollout", lambda slot: worker.remote(*args), b.rollout_workers, b.max_restarts, prepare=self._prepare
        )
        self.scoring = None  # a ray_score.ScorePool when backend.score_workers > 0
        self._model = model
        self.version = 0
        self._weights = None  # ObjectRef of the current weights
        self._stale = True
        self.sync_s = 0.0

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    @model.setter
    def model(self, model: PreTrainedModel) -> None:
        self._model = model
        self._stale = True

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Wait for the workers to start; a RuntimeError (not a silent wait) when Ray cannot
        place them within ``timeout_s``, e.g. too few free CPUs for their reservation."""
        refs = [a.info.remote() for a in self.pool.actors]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            free = self.ray.available_resources().get("CPU", 0)
            raise RuntimeError(
                f"backend: {len(refs) - len(ready)} of {len(refs)} rollout workers did not start within "
                f"{timeout_s:g} s; each reserves backend.worker_threads={self.threads} CPUs and the Ray cluster has "
                f"{free:g} free"
            )

    def _prepare(self, actor) -> None:
        if self._weights is not None:
            actor.load.remote(self._weights, self.version)

    def sync(self, model: PreTrainedModel | None = None) -> int:
        """Send the policy's weights to every worker (one ``ray.put``); returns the new version."""
        start = time.perf_counter()
        if model is not None:
            self._model = model
        self._weights = self.ray.put(policy_weights(self._model))
        self.version += 1
        ref, version = self._weights, self.version
        self.pool.run([(slot, lambda a: a.load.remote(ref, version)) for slot in range(len(self.pool.actors))])
        self._stale = False
        self.sync_s += time.perf_counter() - start
        return self.version

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
        if self._stale:
            self.sync()
        gen = generator if generator is not None else torch.default_generator
        state = gen.get_state()
        total, version = len(requests), self.version
        limits = limit.tolist()

        def call(a: int, b: int):
            return lambda actor: actor.generate.remote(version, requests[a:b], limits[a:b], params, state, (a, total))

        chunks = split_rows(total, len(self.pool.actors))
        results = self.pool.run([(slot, call(a, b)) for slot, (a, b) in enumerate(chunks)])
        tokens = [t for r in results for t in r[0]]
        logprobs = [x for r in results for x in r[1]]
        finished = [f for r in results for f in r[2]]
        advance_generator(gen, total, tokens, params)  # the draws of the one-process engine
        return Generation.prompt_major(len(prompts), n, requests, tokens, logprobs, finished)

    def stats(self) -> dict[str, float]:
        """Per-iteration metrics (restarts since the last call, weight broadcast time)."""
        restarts = self.pool.pop_restarts() + (self.scoring.pool.pop_restarts() if self.scoring else 0)
        out = {"backend/restarts": restarts, "time/sync_s": self.sync_s}
        self.sync_s = 0.0
        return out

    def shutdown(self) -> None:
        """Stop the workers (and Ray itself when this engine started it)."""
        self.pool.shutdown()
        if self.scoring is not None:
            self.scoring.pool.shutdown()
        if self.started_ray:
            self.ray.shutdown()
            self.started_ray = False


def ray_engine(cfg: Config, init_path: str, model: PreTrainedModel, tokenizer, scorer=None) -> RayEngine:
    """The trainer's entry: a RayEngine for ``model``, with scoring workers attached to
    ``scorer`` (a :class:`~creditrl.rewards.stage.Scorer`) when ``backend.score_workers > 0``."""
    engine = RayEngine(cfg, init_path, model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    if cfg.backend.score_workers and scorer is not None:
        from creditrl.distributed.ray_score import ScorePool

        engine.scoring = ScorePool(engine.ray, cfg)
        engine.scoring.attach(scorer)
    engine.wait_ready()
    engine.sync()  # the first iteration's timers measure work, not the workers' start
    engine.sync_s = 0.0
    if engine.scoring is not None:
        pool = engine.scoring.pool
        pool.run([(slot, lambda a: a.info.remote()) for slot in range(len(pool.actors))])
    return engine
