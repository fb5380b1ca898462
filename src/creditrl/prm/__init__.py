"""Process reward models: the stepwise data format, labelers, the model and its training,
negative augmentation, the shortcut probe, metrics and best-of-N selection, and public PRMs
(Math-Shepherd, Qwen2.5-Math-PRM, RLHFlow conventions) read as they are saved."""

from creditrl.prm.augment import augment_negatives, corrupt_step
from creditrl.prm.data import (
    StepwiseExample,
    import_math_shepherd,
    import_prm800k,
    load_stepwise,
    save_stepwise,
)
from creditrl.prm.implicit import ImplicitPRM  # and reward.source=implicit_prm
from creditrl.prm.labels import (
    LABELERS,
    MC_MODES,
    Labeler,
    MCLabels,
    get_labeler,
    mc_labels,
    oracle_labels,
    outcome_heuristic_labels,
    register_labeler,
    vote_labels,
)
from creditrl.prm.metrics import (
    AGGREGATIONS,
    SELECTORS,
    Candidate,
    aggregate_steps,
    auroc,
    best_of_n,
    best_of_n_accuracy,
    false_positive_rate,
    linear_r2,
    majority_vote,
    select,
)
from creditrl.prm.model import ProcessRewardModel, encode
from creditrl.prm.probe import ShortcutReport, StepRecord, shortcut_probe
from creditrl.prm.public import PRM_FORMATS, PublicPRM, detect_format, load_public
from creditrl.prm.source import load_prm, prm_reward_source  # importing it registers reward.source=prm
from creditrl.prm.train import train_prm

__all__ = [
    "PRM_FORMATS",
    "PublicPRM",
    "detect_format",
    "load_public",
    "ImplicitPRM",
    "load_prm",
    "prm_reward_source",
    "ProcessRewardModel",
    "ShortcutReport",
    "StepRecord",
    "augment_negatives",
    "corrupt_step",
    "encode",
    "shortcut_probe",
    "train_prm",
    "StepwiseExample",
    "import_math_shepherd",
    "import_prm800k",
    "load_stepwise",
    "save_stepwise",
    "LABELERS",
    "MC_MODES",
    "Labeler",
    "MCLabels",
    "get_labeler",
    "mc_labels",
    "oracle_labels",
    "outcome_heuristic_labels",
    "register_labeler",
    "vote_labels",
    "AGGREGATIONS",
    "SELECTORS",
    "Candidate",
    "aggregate_steps",
    "auroc",
    "best_of_n",
    "best_of_n_accuracy",
    "false_positive_rate",
    "linear_r2",
    "majority_vote",
    "select",
]
