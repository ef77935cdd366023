"""Per-observation scores: one long table of a run's numbers that the reliability tools read.

A runner that declares `Runner.scores` turns its records into rows of

    key          the unit key the row comes from (a rerun's row pairs with it by key)
    method       the probe method (or the protocol's method) that produced it
    box          the black box observed
    observation  what pairs rows across methods, boxes and probe models: the same users and
                 target under the same seed (e.g. `War+Film-Noir|seed=0`, or calibrate's
                 observation id `seed=0/War+Film-Noir`)
    seed         the seed of the observation (seeds are the replications a sized run adds)
    metric       the figure's name (`coverage`, `exposure`, `delta_auc`, ...)
    value        the figure
    share        whether the metric is a share in [0, 1] (bounded intervals, confidence sequences)

`ctrlsim noise` compares a run's rows with a rerun's by key, probe-model sensitivity
(`--llms`) decomposes the headline metric over box x probe model, and a sized run
(`--precision`) narrows the headline metric's confidence sequences.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from ctrlsim.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

SCORE_COLUMNS = ("key", "method", "box", "observation", "seed", "metric", "value", "share")


@dataclass(frozen=True)
class Scores:
    """What a runner declares so the reliability tools can read its records.

    * `rows(config, records)`: the score rows (dicts with `SCORE_COLUMNS`) of every finished record;
    * `headline(config)`: the metric a sized run narrows and a sensitivity analysis decomposes;
    * `probe_llm_field`: the config field holding the probes' LLM (what `--llms` varies), if any;
    * `reference(config)`: the method every other method is compared with on the same observations
      (a noise run's paired verdicts); None: the first method of the run's rows.
    """

    rows: Callable[[Any, Mapping[str, dict]], Iterable[dict]]
    headline: Callable[[Any], str]
    probe_llm_field: str | None = "llm"
    reference: Callable[[Any], str] | None = None


def score_frame(runner: Any, config: Any, records: Mapping[str, dict]) -> pd.DataFrame:
    """The run's score rows as a DataFrame with `SCORE_COLUMNS` (empty when nothing finished)."""
    import pandas as pd

    if runner.scores is None:
        raise ConfigError(f"{runner.name} declares no per-observation scores (Runner.scores); the "
                          "reliability tools read ctrlbench, calibrate, steereval and promptshift runs")
    frame = pd.DataFrame(list(runner.scores.rows(config, records)), columns=list(SCORE_COLUMNS))
    return frame.astype({"value": float, "share": bool, "seed": int}) if len(frame) else frame


def headline_metric(runner: Any, config: Any) -> str:
    if runner.scores is None:
        raise ConfigError(f"{runner.name} declares no per-observation scores (Runner.scores)")
    return runner.scores.headline(config)
