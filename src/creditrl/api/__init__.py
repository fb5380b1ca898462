"""The Python entry point: :class:`Trainer` builds a run from a model, reward functions and
datasets as TRL's GRPOTrainer takes them (:mod:`creditrl.api.trainer`)."""

from creditrl.api.trainer import Trainer

__all__ = ["Trainer"]
