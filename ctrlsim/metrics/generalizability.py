"""How much a box comparison depends on the probe model that played the users.

The same episodes run with several probe models give a box x model table of replicated scores
(seeds as replicates). A two-way random-effects analysis of variance splits the score variance
into box, probe model, box x model and residual components (expected mean squares, negative
estimates set to 0, as is conventional). From them:

* the generalizability coefficient of the box ranking, E rho^2 = s2_box / (s2_box + s2_box_x_model
  / n_models + s2_residual / (n_models * n_seeds)): the share of the variance of box means (over
  these models and seeds) that is the boxes', 1 when the ranking would not move with other models
  drawn like these;
* Kendall's W of the box ranking across models (1: every model ranks the boxes alike; 0: no
  agreement), with the ties correction;
* the share of box pairs whose order flips between at least one pair of models.

What it cannot show: with two or three probe models the model components are estimated from one
or two degrees of freedom; read them as a warning sign, not a measurement.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Mapping, Sequence

import numpy as np

from ctrlsim.errors import ConfigError


@dataclass(frozen=True)
class VarianceComponents:
    """Variance components of a balanced box x model design with `seeds` replicates per cell.
    With one replicate the interaction and the residual cannot be told apart: `box_x_model` then
    holds both and `residual` is NaN."""

    box: float
    model: float
    box_x_model: float
    residual: float
    boxes: int
    models: int
    seeds: int

    @property
    def shares(self) -> dict[str, float]:
        """Each component's share of their sum (NaN components count as 0)."""
        parts = {"box": self.box, "probe model": self.model, "box x probe model": self.box_x_model,
                 "residual": self.residual}
        total = sum(v for v in parts.values() if np.isfinite(v))
        return {k: (v / total if total > 0 and np.isfinite(v) else float("nan")) for k, v in parts.items()}

    @property
    def g_coefficient(self) -> float:
        """E rho^2 of the box means over these models and seeds (see the module docstring)."""
        residual = 0.0 if not np.isfinite(self.residual) else self.residual
        error = self.box_x_model / self.models + residual / (self.models * self.seeds)
        total = self.box + error
        return float(self.box / total) if total > 0 else float("nan")


def _cube(scores: Mapping[str, Mapping[str, Sequence[float]]]) -> tuple[list, list, np.ndarray]:
    boxes = list(scores)
    if len(boxes) < 2:
        raise ConfigError(f"a box x probe-model analysis needs at least two boxes, got {boxes}")
    models = list(scores[boxes[0]])
    if len(models) < 2:
        raise ConfigError(f"a box x probe-model analysis needs at least two probe models, got {models}")
    sizes = {(b, m): len(scores[b].get(m, ())) for b in boxes for m in models}
    if any(set(scores[b]) != set(models) for b in boxes) or len(set(sizes.values())) != 1:
        raise ConfigError(f"the box x probe-model design must be balanced (every box with every model, the "
                          f"same seeds); cell sizes: {sizes}")
    seeds = next(iter(sizes.values()))
    if seeds < 1:
        raise ConfigError("every box x probe-model cell needs at least one score")
    cube = np.array([[list(scores[b][m]) for m in models] for b in boxes], dtype=float)
    if not np.all(np.isfinite(cube)):
        raise ConfigError("a box x probe-model score is missing or not finite")
    return boxes, models, cube


def variance_components(scores: Mapping[str, Mapping[str, Sequence[float]]]) -> VarianceComponents:
    """Components from `scores[box][model]` = the seeds' scores (see the module docstring)."""
    _, _, y = _cube(scores)
    a, b, n = y.shape
    grand = y.mean()
    box_means, model_means, cells = y.mean(axis=(1, 2)), y.mean(axis=(0, 2)), y.mean(axis=2)
    ms_box = b * n * ((box_means - grand) ** 2).sum() / (a - 1)
    ms_model = a * n * ((model_means - grand) ** 2).sum() / (b - 1)
    interaction = cells - box_means[:, None] - model_means[None, :] + grand
    ms_inter = n * (interaction ** 2).sum() / ((a - 1) * (b - 1))
    if n > 1:
        ms_error = ((y - cells[:, :, None]) ** 2).sum() / (a * b * (n - 1))
        residual, box_x_model = ms_error, max(0.0, (ms_inter - ms_error) / n)
    else:
        residual, box_x_model = float("nan"), ms_inter
    return VarianceComponents(box=max(0.0, (ms_box - ms_inter) / (b * n)),
                              model=max(0.0, (ms_model - ms_inter) / (a * n)),
                              box_x_model=float(box_x_model), residual=float(residual),
                              boxes=a, models=b, seeds=n)


def kendalls_w(rankings: np.ndarray) -> float:
    """Kendall's W of `rankings[rater][object]` (scores; ranked here, ties get mean ranks), with the
    ties correction: 1 for full agreement, 0 for none."""
    from scipy.stats import rankdata

    scores = np.asarray(rankings, dtype=float)
    m, n = scores.shape
    if m < 2 or n < 2:
        raise ConfigError(f"Kendall's W needs at least two raters and two objects, got {m} x {n}")
    ranks = np.vstack([rankdata(row) for row in scores])
    s = ((ranks.sum(axis=0) - m * (n + 1) / 2) ** 2).sum()
    ties = sum(((c ** 3) - c).sum() for c in (np.unique(row, return_counts=True)[1] for row in scores))
    denominator = m ** 2 * (n ** 3 - n) - m * ties
    return float(12 * s / denominator) if denominator > 0 else float("nan")


def flipped_pairs(scores: Mapping[str, Mapping[str, Sequence[float]]]) -> float:
    """Share of box pairs ordered one way by one model's mean scores and the other way by another's
    (a tie under a model is no order)."""
    _, _, y = _cube(scores)
    means = y.mean(axis=2)  # box x model
    pairs = list(combinations(range(means.shape[0]), 2))
    flipped = 0
    for i, j in pairs:
        signs = {int(np.sign(d)) for d in means[i] - means[j]}
        flipped += {-1, 1} <= signs
    return flipped / len(pairs)


def model_sensitivity(scores: Mapping[str, Mapping[str, Sequence[float]]]) -> dict:
    """Everything above for one table: components and shares, E rho^2, Kendall's W, flipped pairs."""
    _, models, y = _cube(scores)
    components = variance_components(scores)
    return {"components": components, "shares": components.shares, "g_coefficient": components.g_coefficient,
            "kendalls_w": kendalls_w(y.mean(axis=2).T), "flipped_pairs": flipped_pairs(scores),
            "models": models}


__all__ = ["VarianceComponents", "flipped_pairs", "kendalls_w", "model_sensitivity", "variance_components"]
