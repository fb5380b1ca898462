"""Credit assignment: turn per-token rewards into per-token advantages, then normalise them.

``estimate(name, rewards, reward_mask, response_mask, ...)`` runs a registered estimator;
``normalise(name, advantages, response_mask, ...)`` runs a registered normaliser.
"""

# Importing the estimators module is what registers the estimators in ESTIMATORS.
from creditrl.credit.estimators import reward_to_go
from creditrl.credit.normalise import NORMALISERS, normalise
from creditrl.credit.registry import ESTIMATORS, estimate, register_estimator, requires

__all__ = [
    "ESTIMATORS",
    "NORMALISERS",
    "estimate",
    "normalise",
    "register_estimator",
    "requires",
    "reward_to_go",
]
