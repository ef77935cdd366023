"""The smallest effect a paired comparison of this size could detect (its minimum detectable effect).

For a paired t test at level alpha (two-sided) on n pairs whose differences have standard
deviation s, the MDE is the true mean difference delta at which the test rejects with probability
`power`: power(delta) = P(|T| > t_crit) with T noncentral t on n - 1 degrees of freedom and
noncentrality delta * sqrt(n) / s. Solved for delta by root finding (scipy's noncentral t). A
difference smaller than the MDE that the test does not find is not evidence of no difference: the
run was too small to see it.
"""
from __future__ import annotations

import math

from ctrlsim.errors import ConfigError


def paired_power(delta: float, sd: float, n: int, alpha: float = 0.05, *, two_sided: bool = True) -> float:
    """Power of the paired t test on n pairs for a true mean difference `delta` (two-sided, or
    one-sided in the direction of `delta`)."""
    from scipy.stats import nct, t

    df = n - 1
    critical = t.ppf(1 - alpha / 2, df) if two_sided else t.ppf(1 - alpha, df)
    noncentrality = delta * math.sqrt(n) / sd
    power = float(nct.sf(critical, df, noncentrality))
    if two_sided:
        power += float(nct.cdf(-critical, df, noncentrality))
    # scipy's noncentral t gives NaN far in the tail (noncentrality in the tens): power is 1 there
    return 1.0 if math.isnan(power) else power


def minimum_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8,
                              two_sided: bool = True) -> float:
    """The MDE of a paired t test (see the module docstring; `two_sided=False` for a one-tailed test
    such as SteerEval's and PromptShift's); NaN when n < 2 or sd is undefined, 0 when the
    differences do not vary."""
    from scipy.optimize import brentq

    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ConfigError(f"alpha and power must be in (0, 1), got {alpha!r}, {power!r}")
    if n < 2 or sd is None or not math.isfinite(sd):
        return float("nan")
    if sd == 0:
        return 0.0
    from scipy.stats import norm

    z_alpha = norm.ppf(1 - alpha / 2) if two_sided else norm.ppf(1 - alpha)
    upper = (z_alpha + norm.ppf(power)) * sd / math.sqrt(n)  # the normal approximation
    while paired_power(upper, sd, n, alpha, two_sided=two_sided) < power:
        upper *= 2
    return float(brentq(lambda d: paired_power(d, sd, n, alpha, two_sided=two_sided) - power, 0.0, upper,
                        xtol=1e-10 * sd))


__all__ = ["minimum_detectable_effect", "paired_power"]
