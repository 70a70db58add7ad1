"""Speed curves: pure shape functions (:mod:`models`), their fits with R² (:mod:`fit`),
profile files and the :class:`Profile` the controller predicts with (:mod:`profile`),
the one step-time model (:mod:`online`), a profile as text (:mod:`report`), and plots
(:mod:`plot`, imported on demand because it loads matplotlib)."""

from tuned.curves.fit import (FitError, FitResult, KvDemand, fit_speed_models, fit_step_time,
                              fit_usl, kv_bytes_per_token, kv_demand, r_squared)
from tuned.curves.models import (linear_speed, logistic_speed, step_time, step_time_kv,
                                 usl_speed, usl_throughput)
from tuned.curves.profile import (SCHEMA_VERSION, Profile, ProfileError, build_profile,
                                  load_profile, save_profile)

__all__ = [
    "FitError", "FitResult", "KvDemand", "Profile", "ProfileError", "SCHEMA_VERSION",
    "build_profile", "fit_speed_models", "fit_step_time", "fit_usl", "kv_bytes_per_token",
    "kv_demand", "linear_speed", "load_profile", "logistic_speed", "r_squared",
    "save_profile", "step_time", "step_time_kv", "usl_speed", "usl_throughput",
]
