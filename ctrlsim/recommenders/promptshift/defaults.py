"""PromptShift's protocol setting, defined once (Gan & Dong, section 5.1).

The package's classes, the Gymnasium env (`ctrlsim.envs.promptshift_env`) and the
runner's config (`ctrlsim.experiments.promptshift.config.PromptShiftConfig`) take
their defaults from here, so the env and the CLI cannot drift apart.
"""
from __future__ import annotations

from ctrlsim.backends.bundled import DEFAULT_LLM  # noqa: F401 - the env's model when none is named
from ctrlsim.metrics.promptshift import RHO

N_CANDIDATES = 30         # N, titles asked of the LLM per list
K = 20                    # K, the evaluated list length
HISTORY_LEN = 25          # |H_u|, fit positives in the prompt
MIN_FIT_POSITIVES = 25    # fit positives an eligible user needs
FRACTIONS = (0.72, 0.08, 0.20)  # per-user chronological split: fit, validation, test
RBO_P = 0.9               # RBO persistence p
# RHO, the Difficulty@K rank bonus, is the metric module's constant (re-exported here).

# The one definition of PromptShift's positives: a rating >= 4 on explicit feedback, >= 2 plays on
# listening data (Last.fm). `AUTO` picks between them from the dataset; None counts every interaction.
MOVIE_POSITIVE, PLAY_POSITIVE = 4.0, 2.0
AUTO = "auto"

# Title matching: the fuzzy threshold used when it is neither fixed nor chosen on validation, and
# the thresholds tried on validation (rapidfuzz scores; 100 is exact matching only).
MATCH_THRESHOLD = 90.0
MATCH_THRESHOLDS = (80.0, 85.0, 90.0, 95.0, 100.0)
# Unmatched titles in SliceShift: "zero" (the formula as written, the default) or "skip".
UNMATCHED_POLICIES = ("zero", "skip")


TEMPERATURE = 0.0             # greedy decoding (the paper holds decoding fixed across conditions)


def default_max_tokens(n: int) -> int:
    """The reply budget for an N-title list: 16 tokens per title + 32."""
    return 16 * int(n) + 32


__all__ = ["AUTO", "DEFAULT_LLM", "FRACTIONS", "HISTORY_LEN", "K", "MATCH_THRESHOLD", "MATCH_THRESHOLDS",
           "MIN_FIT_POSITIVES", "MOVIE_POSITIVE", "N_CANDIDATES", "PLAY_POSITIVE", "RBO_P", "RHO",
           "TEMPERATURE", "UNMATCHED_POLICIES", "default_max_tokens"]
