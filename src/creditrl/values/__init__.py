"""Value sources: where the ``values`` V(s_t) that GAE-style estimators need come from."""

from creditrl.values.mc import MCValues, mc_values

__all__ = ["MCValues", "mc_values"]
