"""creditrl: RL fine-tuning of language models where credit assignment comes first."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Trainer"]


def __getattr__(name: str) -> Any:
    """``creditrl.Trainer`` is imported on first use: ``import creditrl`` (and every command line
    that only reads a config) stays free of torch."""
    if name == "Trainer":
        from creditrl.api import Trainer

        return Trainer
    raise AttributeError(f"module 'creditrl' has no attribute {name!r}")
