"""Pure metric functions (numpy/scipy only) shared by the envs and every protocol."""
from ctrlsim.metrics.controllability import (
    average_behaviour_length,
    average_tokens,
    coverage,
    exploration_efficiency,
    js_divergence,
    mean_popularity,
    trajectory_smoothness,
)
from ctrlsim.metrics.persistence import (
    HalfLife,
    effort_curve,
    effort_to_threshold,
    half_life,
    initial_slope,
    km_half_life,
    log_rank,
    relapse_share,
    retention_area,
    retention_band,
    retention_curve,
    steered_levels,
)
from ctrlsim.metrics.ranking import (
    auc_t,
    coverage_at_k,
    drift,
    hit_rate_at_k,
    mrr_at_k,
    ndcg_at_k,
    rank_set,
    rbo,
)
from ctrlsim.metrics.stats import TTest, format_test, paired_t_test
from ctrlsim.metrics.steereval import direction_cell, rejected_tags, steereval_figures

__all__ = [
    "TTest", "auc_t", "average_behaviour_length", "average_tokens", "coverage", "coverage_at_k",
    "direction_cell", "drift", "format_test", "rejected_tags", "steereval_figures",
    "exploration_efficiency", "hit_rate_at_k", "js_divergence", "mean_popularity", "mrr_at_k", "ndcg_at_k",
    "paired_t_test", "rank_set", "rbo", "trajectory_smoothness",
    # steer-then-release persistence and effort (metrics.persistence)
    "HalfLife", "effort_curve", "effort_to_threshold", "half_life", "initial_slope", "km_half_life",
    "log_rank", "relapse_share", "retention_area", "retention_band", "retention_curve", "steered_levels",
]
