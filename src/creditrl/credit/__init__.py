"""Credit assignment: turn per-token rewards into per-token advantages, then normalise them.

``estimate(name, rewards, reward_mask, response_mask, ...)`` runs a registered estimator;
``estimate_at(resolution, name, ...)`` runs it with one time step per token or per reasoning
step (and with VAPO's length-adaptive and VC-PPO's decoupled lambdas, :mod:`.lambdas`);
``normalise(name, advantages, response_mask, ...)`` runs a registered normaliser.
"""

# Importing the estimator modules is what registers the estimators in ESTIMATORS.
from creditrl.credit.estimators import discounted_cumsum, reward_to_go
from creditrl.credit.gae import gae
from creditrl.credit.lambdas import length_adaptive_lam
from creditrl.credit.min_form import min_form, min_to_go
from creditrl.credit.normalise import NORMALISERS, normalise
from creditrl.credit.outcome import outcome_advantage
from creditrl.credit.registry import ESTIMATORS, estimate, register_estimator, requires
from creditrl.credit.resolution import RESOLUTIONS, StepView, credit_lengths, estimate_at, step_view

__all__ = [
    "ESTIMATORS",
    "NORMALISERS",
    "RESOLUTIONS",
    "StepView",
    "credit_lengths",
    "discounted_cumsum",
    "estimate",
    "estimate_at",
    "gae",
    "length_adaptive_lam",
    "min_form",
    "min_to_go",
    "normalise",
    "outcome_advantage",
    "register_estimator",
    "requires",
    "reward_to_go",
    "step_view",
]
