"""``creditrl.Trainer``: a run from Python objects, in TRL's terms.

::

    trainer = creditrl.Trainer(model="path/or/name", reward_funcs=[f, g], train_dataset=ds,
                               config={"rollout.group_size": 8, "loss.kl_coef": 0.04})
    run_dir = trainer.train()

It turns the objects into a config and the files a run reads (a model object saved to
``RUN_DIR/start_policy``, datasets to ``RUN_DIR/data``, reward functions named as reward sources),
then runs the same build and loop as ``creditrl train``; the resolved config is the run
directory's ``config.yaml``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from creditrl.api.data import PROMPT_TASK, write_rows
from creditrl.api.functions import source_name
from creditrl.config import Config
from creditrl.config.loader import merge, merge_layer, read_yaml
from creditrl.config.validation import validated
from creditrl.errors import ConfigError

__all__ = ["Trainer", "config_layer"]

_PROMPT_TASK_ARGS = ("train_file", "heldout_file", "step_separator", "system_prompt")


def config_layer(config: Config | Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    """``config`` as nested sections: a :class:`~creditrl.config.Config`, a YAML file, or a mapping
    whose keys may be dotted (``{"rollout.group_size": 8}``, ``{"loss": {"kl_coef": 0.04}}``);
    values are taken as they are (not parsed as YAML)."""
    if config is None:
        return {}
    if isinstance(config, Config):
        return config.to_dict()
    if isinstance(config, (str, Path)):
        return read_yaml(config)
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a Config, a mapping or a YAML path, got a {type(config).__name__}")
    out: dict[str, Any] = {}
    for key, value in config.items():
        parts = str(key).split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config: '{key}': '{p}' is set to a value above, not a section")
        leaf = parts[-1]
        node[leaf] = merge(node[leaf], value) if isinstance(value, dict) and isinstance(node.get(leaf), dict) else value
    return out


class Trainer:
    """An RL run of ``model`` on ``train_dataset`` with ``reward_funcs``, configured by ``config``.

    Args:
        model: A local ``save_pretrained`` folder, a hub name in the local cache (or the ``tiny``
            preset), or a ``PreTrainedModel`` (saved into the run directory with
            ``processing_class``, or with the tokenizer of its own folder). None keeps the config's
            ``policy.model``.
        reward_funcs: TRL reward functions ``f(prompts, completions, **kwargs) -> list[float | None]``
            (:mod:`creditrl.rewards.functions` has the contract; ``async def`` and
            ``@reward_function(granularity="step")`` too), or source names (``"outcome"``,
            ``"rm:PATH"``, ``"module:function"``); the first is ``reward.source``, the rest
            ``reward.sources``, weighed by ``reward.weights``. Empty keeps the config's.
        train_dataset: A ``datasets.Dataset`` (or a list of row dicts) in TRL's formats: a ``prompt``
            column, text or conversational, or ``messages``; with an ``answer`` column the ``math``
            task checks answers, without one the rewards alone judge (:mod:`creditrl.api.data`).
            Every other column reaches the reward functions. None keeps the config's task.
        eval_dataset: The held-out rows of the same kind; None evaluates on ``train_dataset``'s.
        config: A :class:`~creditrl.config.Config`, a YAML path, or a mapping of (dotted) keys.
        processing_class: The tokenizer of a ``model`` object.
        run_dir: Where the run is written (default ``runs/train-TIMESTAMP``).
        overwrite: Replace a run already in ``run_dir``.
    """

    def __init__(
        self,
        model: Any = None,
        reward_funcs: Sequence[Callable[..., Any] | str] | Callable[..., Any] | str = (),
        train_dataset: Any = None,
        eval_dataset: Any = None,
        config: Config | Mapping[str, Any] | str | Path | None = None,
        *,
        processing_class: Any = None,
        run_dir: str | Path | None = None,
        overwrite: bool = False,
    ) -> None:
        if eval_dataset is not None and train_dataset is None:
            raise ConfigError("eval_dataset: pass train_dataset too")
        if processing_class is not None and (model is None or isinstance(model, (str, Path))):
            raise ConfigError("processing_class: goes with a model object; a model folder or name brings its tokenizer")
        self.model, self.processing_class = model, processing_class
        funcs = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
        self.reward_names = [source_name(f) for f in funcs]
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.user = config_layer(config)
        self.run_dir = Path(run_dir) if run_dir else Path("runs") / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
        self.overwrite = overwrite
        self.history: list[dict[str, Any]] = []  # every metrics.jsonl row, after train()
        self.config = self._config({})  # checked now, so a bad key fails before any work

    # -- config -------------------------------------------------------------------------------
    def _config(self, written: dict[str, Any]) -> Config:
        """Defaults <- ``config`` <- what the objects give (``written``: the paths written for them)."""
        data = merge_layer(Config().to_dict(), self.user)
        mine: dict[str, Any] = {}
        if isinstance(self.model, (str, Path)):
            mine["policy"] = {"model": str(self.model)}
        if "model" in written:
            mine["policy"] = {"model": written["model"]}
        if self.reward_names:
            mine["reward"] = {"source": self.reward_names[0], "sources": self.reward_names[1:]}
        if "train" in written:
            user_args = dict((self.user.get("task") or {}).get("args") or {})
            args = {**user_args, "train_file": written["train"], "heldout_file": written.get("eval", written["train"])}
            if "answer" not in written["columns"]:
                args = {k: v for k, v in args.items() if k in _PROMPT_TASK_ARGS}
            mine["task"] = {"name": "math" if "answer" in written["columns"] else PROMPT_TASK, "args": args}
        return validated(Config, merge_layer(data, mine))

    def _write_inputs(self) -> dict[str, Any]:
        """Save a model object and the datasets into the run directory; their paths."""
        written: dict[str, Any] = {}
        if self.model is not None and not isinstance(self.model, (str, Path)):
            written["model"] = str(self._save_model(self.run_dir / "start_policy"))
        if self.train_dataset is not None:
            data = self.run_dir / "data"
            written["columns"] = write_rows(self.train_dataset, data / "train.jsonl", "train_dataset")
            written["train"] = str((data / "train.jsonl").resolve())
            if self.eval_dataset is not None:
                write_rows(self.eval_dataset, data / "eval.jsonl", "eval_dataset")
                written["eval"] = str((data / "eval.jsonl").resolve())
        return written

    def _save_model(self, out: Path) -> Path:
        if not hasattr(self.model, "save_pretrained"):
            kind = type(self.model).__name__
            raise ConfigError(f"model: expected a path, a hub name or a PreTrainedModel, got a {kind}")
        tok = self.processing_class
        if tok is None:
            source = Path(str(getattr(self.model, "name_or_path", "") or ""))
            if not (source.is_dir() and any(source.glob("tokenizer*"))):
                raise ConfigError("model: a PreTrainedModel object needs its tokenizer: pass processing_class=")
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(source)
        self.model.save_pretrained(out)
        tok.save_pretrained(out)
        return out.resolve()

    # -- run ----------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: bool = False) -> Path:
        """Train; returns the run directory (``metrics.jsonl``, ``checkpoints/``, ``final/``: the
        trained policy for ``from_pretrained``). ``resume_from_checkpoint`` continues the run in
        ``run_dir`` from its newest intact checkpoint (its saved config and data)."""
        from creditrl.distributed import ddp
        from creditrl.train import rundir
        from creditrl.train.rl import RLTrainer

        with rundir.hold(self.run_dir):
            if resume_from_checkpoint:
                trainer = RLTrainer.resume(self.run_dir)
            else:
                if rundir.holds_run(self.run_dir) and not self.overwrite:
                    raise ConfigError(
                        f"{self.run_dir} already holds a run: continue it with "
                        "trainer.train(resume_from_checkpoint=True), or start afresh with Trainer(..., overwrite=True)"
                    )
                rundir.check_fresh(self.run_dir, overwrite=self.overwrite)
                self.config = self._config(self._write_inputs())
                trainer = RLTrainer.from_config(self.config, self.run_dir, overwrite=self.overwrite)
            try:
                result = trainer.run()
            finally:
                ddp.shutdown()
        self.config, self.history = trainer.parts.config, result.history
        return result.run_dir
