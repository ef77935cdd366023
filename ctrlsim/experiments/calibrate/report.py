"""`ctrlsim calibrate`'s tables and figure, from its unit records.

Every statistic pairs observations by id (the same episode, scenario or user at each lambda):

* each cell: mean over the observations with its 95% Student t interval (`mean_ci`);
* Spearman's rho between lambda and the metric over every (lambda, observation) with a cluster
  bootstrap interval (an observation's values at all lambdas resampled together);
* a step from lambda a to b is *told apart* when the paired test of the observations' values
  at b against a has p < 0.05 (two-sided; `step_test`), and the resolution is the smallest step
  d such that every pair of grid points d apart is told apart;
* a compared box's matched lambda is where the calibration curve (means made non-decreasing,
  linear between grid points) reaches the box's mean; its interval is every lambda whose 95% band
  overlaps the box's 95% interval. A method whose curve is not resolved gives no scale.

With `--task persistence` the tables, figure and summary are `persistence`'s (half-life against
the dial's memory window).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ctrlsim.experiments.calibrate.common import ALPHA, _name, cost_table, validity
from ctrlsim.experiments.scores import Scores
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.metrics.bounded import share_ci
from ctrlsim.metrics.stats import Estimate, format_estimate, mean_ci, spearman_ci, step_test
from ctrlsim.recommenders.dial import format_lambda

EXACT = 1e-9
METRIC_LABELS = {"coverage": "Coverage (%)", "exposure": "Exposure (% of the target surfaced)",
                 "delta_auc": "signed Delta-AUC_t", "drift": "Drift (1 - RBO against L^0)",
                 "slice_shift": "SliceShift"}


def _label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


# Metrics the observations store in percent (ctrlbench's Coverage and Exposure).
PERCENT_METRICS = ("coverage", "exposure")


def _digits(metric: str) -> int:
    """Decimals a metric's cells show: percentages 2, fractions and AUC differences 4."""
    return 2 if metric in PERCENT_METRICS else 4


# ----------------------------------------------------------------------------- collecting

def observations(records: Mapping[str, dict]) -> dict[tuple[str, str], dict[str, dict[str, float]]]:
    """(method, box) -> metric -> observation id -> value, over every seed's unit."""
    out: dict[tuple[str, str], dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for record in records.values():
        for metric, values in record["values"].items():
            out[(record["method"], record["box"])][metric].update(values)
    return out


def score_rows(config, records: Mapping[str, dict]):
    """Every observation of every unit as a score row (`ctrlsim.experiments.scores`); shares in
    [0, 1] (a percent metric divided by 100)."""
    shares = config.observation.share_metrics
    for key, record in records.items():
        for metric, values in record["values"].items():
            scale = 0.01 if metric in PERCENT_METRICS and metric in shares else 1.0
            for obs_id, value in values.items():
                yield {"key": key, "method": record["method"], "box": record["box"], "observation": obs_id,
                       "seed": record["seed"], "metric": metric, "value": scale * value,
                       "share": metric in shares}


SCORES = Scores(rows=score_rows, headline=lambda config: config.metrics[0],
                reference=lambda config: config.all_methods[0])


def curve(config, obs, method: str, metric: str) -> dict[float, dict[str, float]]:
    """lambda -> observation id -> value of one method on the dial grid (missing units left out)."""
    return {lam: dict(obs[(method, config.dial_box(lam))][metric]) for lam in config.grid
            if (method, config.dial_box(lam)) in obs}


# ----------------------------------------------------------------------------- statistics

@dataclass(frozen=True)
class Step:
    delta: float
    told_apart: int
    pairs: int
    max_p: float


@dataclass(frozen=True)
class Resolution:
    steps: tuple[Step, ...]

    @property
    def value(self) -> float | None:
        """The smallest step every pair of grid points that far apart is told apart at (None: none)."""
        for step in self.steps:
            if step.pairs and step.told_apart == step.pairs:
                return step.delta
        return None


def resolution(by_lambda: Mapping[float, Mapping[str, float]], alpha: float = ALPHA) -> Resolution:
    grid = sorted(by_lambda)
    deltas = sorted({round(b - a, 9) for i, a in enumerate(grid) for b in grid[i + 1:]})
    steps = []
    for delta in deltas:
        told = pairs = 0
        worst = 0.0
        for i, a in enumerate(grid):
            for b in grid[i + 1:]:
                if round(b - a, 9) != delta:
                    continue
                common = sorted(set(by_lambda[a]) & set(by_lambda[b]))
                test = step_test([by_lambda[b][o] for o in common], [by_lambda[a][o] for o in common])
                pairs += 1
                p = test.p if not np.isnan(test.p) else 1.0
                told += int(p < alpha)
                worst = max(worst, p)
        steps.append(Step(delta, told, pairs, worst))
    return Resolution(tuple(steps))


def rho_of(by_lambda: Mapping[float, Mapping[str, float]]):
    xs, ys, ids = [], [], []
    for lam, values in by_lambda.items():
        for obs_id, value in values.items():
            xs.append(lam)
            ys.append(value)
            ids.append(obs_id)
    return spearman_ci(xs, ys, ids)


def match_lambda(grid: list[float], estimates: list[Estimate], box: Estimate) -> tuple[str, float | None]:
    """("0.37 [0.25, 0.50]" or why not, the matched lambda) of a box on a method's calibration curve."""
    means = np.array([e.value for e in estimates])
    if box.n == 0 or np.isnan(box.value) or np.isnan(means).any() or len(grid) < 2:
        return "-", None
    lows = np.array([e.low if e.n > 1 and not np.isnan(e.low) else e.value for e in estimates])
    highs = np.array([e.high if e.n > 1 and not np.isnan(e.high) else e.value for e in estimates])
    if means[-1] <= means[0]:
        return "no scale: the metric does not grow with lambda", None
    # A calibration curve is monotone by construction; sampling noise is flattened, not inverted.
    means, lows, highs = (np.maximum.accumulate(v) for v in (means, lows, highs))
    fine = np.linspace(grid[0], grid[-1], 1001)
    m, lo, hi = (np.interp(fine, grid, v) for v in (means, lows, highs))
    b_lo = box.low if box.n > 1 and not np.isnan(box.low) else box.value
    b_hi = box.high if box.n > 1 and not np.isnan(box.high) else box.value
    inside = fine[(hi >= b_lo) & (lo <= b_hi)]
    interval = f" [{inside.min():.2f}, {inside.max():.2f}]" if inside.size else " [no overlap]"
    if box.value < m[0]:
        return f"below lambda = {format_lambda(grid[0])}{interval}", None
    if box.value > m[-1]:
        return f"above lambda = {format_lambda(grid[-1])}{interval}", None
    lam = float(fine[np.argmax(m >= box.value)])
    return f"{lam:.2f}{interval}", lam


# ----------------------------------------------------------------------------- known answers

def known_answer(config, method: str, metric: str, records_at_zero: list[dict], observed: dict[str, float]):
    """(what the metric must be at lambda = 0, observed summary, holds) or None when nothing is known."""
    if not observed:
        return None
    values = np.array(list(observed.values()))
    if config.protocol == "steereval" or (config.protocol == "promptshift" and method == "b0"):
        error = float(np.abs(values).max())
        return "0 exactly", f"mean {values.mean():+.4f}, max abs {error:.2g}", error <= EXACT
    if config.protocol != "ctrlbench":
        return None
    known: dict[str, float] = {}
    for record in records_at_zero:
        known.update(record.get("known", {}).get("exposure", {}))
    common = [o for o in observed if o in known]
    if not common:
        return None
    gap = np.array([observed[o] - known[o] for o in common])
    fixed = f"the fixed ranking's exposure, mean {np.mean([known[o] for o in common]):.2f}"
    if metric == "exposure" or method == "oracle":
        return "= " + fixed, f"max abs error {np.abs(gap).max():.2g}", bool(np.abs(gap).max() <= EXACT)
    return "<= " + fixed, f"largest excess {gap.max():+.2f}", bool(gap.max() <= EXACT)


# ----------------------------------------------------------------------------- tables

def _estimate(config, metric: str, values: Mapping[str, float]) -> Estimate:
    """A metric's mean over observations: a bounded bootstrap interval for a share (Coverage,
    Exposure, Drift), which stays in [0, 1]; a Student t interval otherwise (docs/statistics.md)."""
    if metric in config.observation.share_metrics:
        return share_ci(list(values.values()))
    return mean_ci(list(values.values()))


def _cell(est: Estimate, digits: int) -> str:
    return format_estimate(est, digits=digits, bounds=est.method != "t")


def metric_table(config, obs, metric: str, names: Mapping[str, str] | None = None) -> Table:
    rows = []
    for method in config.all_methods:
        by_lambda = curve(config, obs, method, metric)
        cells = [_cell(_estimate(config, metric, by_lambda[lam]), _digits(metric))
                 if lam in by_lambda else "-" for lam in config.grid]
        corr = rho_of(by_lambda)
        rho = format_estimate(Estimate(corr.rho, corr.low, corr.high, corr.n), bounds=True, signed=True)
        n = sorted({len(v) for v in by_lambda.values()})
        rows.append([_name(names, method), *cells, rho, "/".join(map(str, n)) or "0"])
    header = ["Method", *(f"lambda = {format_lambda(lam)}" for lam in config.grid), "Spearman rho [95% CI]",
              "obs. per lambda"]
    return Table.of(f"{_label(metric)} against lambda", rows, header)


KNOWN_HEADER = ["Method", "Metric", "Known answer at lambda = 0", "Observed", "Holds"]


def known_table(config, records: Mapping[str, dict], obs, names: Mapping[str, str] | None = None) -> Table:
    return Table.of("Known answers at lambda = 0", known_rows(config, records, obs, names), KNOWN_HEADER)


def known_rows(config, records: Mapping[str, dict], obs, names: Mapping[str, str] | None = None) -> list:
    """The known-answer table's rows (cells as shown): what a dial at lambda 0 must give, and what it gave."""
    rows = []
    zero = config.grid[0]
    for method in config.all_methods:
        at_zero = [r for r in records.values() if r["method"] == method and r["box"] == config.dial_box(zero)]
        for metric in config.metrics:
            observed = curve(config, obs, method, metric).get(zero, {})
            answer = known_answer(config, method, metric, at_zero, observed) if zero == 0.0 else None
            if answer is None:
                cell = _cell(_estimate(config, metric, observed), 4) if observed else "-"
                rows.append([_name(names, method), _label(metric), "none known", cell, "-"])
            else:
                rows.append([_name(names, method), _label(metric), answer[0], answer[1],
                             "yes" if answer[2] else "NO"])
    return rows


def resolution_table(config, obs, names: Mapping[str, str] | None = None) -> Table:
    header = ["Method", "Metric", "Resolution"]
    rows = []
    deltas: list[float] = []
    results = {}
    for method in config.all_methods:
        for metric in config.metrics:
            res = resolution(curve(config, obs, method, metric))
            results[(method, metric)] = res
            deltas = sorted(set(deltas) | {s.delta for s in res.steps})
    header += [f"step {format_lambda(d)}: told apart (max p)" for d in deltas]
    for (method, metric), res in results.items():
        by_delta = {s.delta: s for s in res.steps}
        value = res.value
        cells = [f"{by_delta[d].told_apart}/{by_delta[d].pairs} ({by_delta[d].max_p:.2g})" if d in by_delta
                 else "-" for d in deltas]
        shown = "not resolved" if value is None else format_lambda(value)
        rows.append([_name(names, method), _label(metric), shown, *cells])
    return Table.of("Resolution: the smallest lambda step told apart", rows, header)


def compare_table(config, obs, names: Mapping[str, str] | None = None) -> Table:
    metric = config.metrics[0]
    rows = []
    for box in config.compare:
        for method in config.all_methods:
            if (method, box) not in obs:
                continue
            box_est = _estimate(config, metric, obs[(method, box)][metric])
            by_lambda = curve(config, obs, method, metric)
            grid = [lam for lam in config.grid if lam in by_lambda]
            if resolution(by_lambda).value is None:  # a flat or unresolved curve is no scale
                text = "no scale: the method does not resolve the dial"
            else:
                text, _ = match_lambda(grid, [_estimate(config, metric, by_lambda[lam]) for lam in grid],
                                       box_est)
            rows.append([box, _name(names, method), _cell(box_est, _digits(metric)), text])
    return Table.of("Real boxes on the dial's scale", rows,
                    ["Box", "Method", _label(metric), "Responds like lambda [95% interval]"])


def render_tables(config, records: Mapping[str, dict]) -> list[Block]:
    if config.persistence:  # the half-life against the memory window: its own tables
        from ctrlsim.experiments.calibrate.persistence import persistence_tables

        return persistence_tables(config, records)
    obs = observations(records)
    n, total = len(records), len(config.keys())
    options = ", ".join(config.dial_options) or "defaults"
    head = [f"# Calibration of {config.protocol}: {n}/{total} units",
            f"dataset {config.dataset}; methods {', '.join(config.all_methods)}; dial boxes "
            f"{config.dial_box(0).split(':')[0]}:<lambda> ({options}); lambda grid "
            f"{', '.join(map(format_lambda, config.grid))}; seeds {', '.join(map(str, config.seeds))}.",
            "Each cell: the mean over the observations (ctrlbench: episodes; steereval: scenarios; "
            "promptshift: users x scenarios) with its 95% confidence interval: [low, high] bounds of a "
            "bootstrap interval for a share (it stays in the metric's range), mean ± half-width of a t "
            "interval otherwise (docs/statistics.md). Steps are paired tests over the same observations, "
            f"told apart at p < {ALPHA}."]
    blocks: list[Block] = [Text("\n".join(head))]
    found, names = validity(records)
    blocks += [metric_table(config, obs, metric, names) for metric in config.metrics]
    blocks += [known_table(config, records, obs, names), resolution_table(config, obs, names)]
    if config.protocol == "ctrlbench":
        from ctrlsim.experiments.calibrate.reliability import pass_k_table

        blocks.append(pass_k_table(config, obs, records, names))
    if config.compare:
        blocks.append(compare_table(config, obs, names))
    blocks.append(cost_table(config, records, names))
    if found:
        from ctrlsim.experiments.validity_card import validity_table

        blocks.append(validity_table(found))
    return blocks


# ----------------------------------------------------------------------------- figure

def calibration_figure(config, records: Mapping[str, dict]):
    """One panel per metric: the metric against lambda, a line and 95% band per method; compared
    boxes as dotted horizontal lines."""
    from matplotlib.figure import Figure

    obs = observations(records)
    metrics = config.metrics
    fig = Figure(figsize=(4.6 * len(metrics), 3.6))
    for n, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), n + 1)
        for method in config.all_methods:
            by_lambda = curve(config, obs, method, metric)
            grid = [lam for lam in config.grid if lam in by_lambda and by_lambda[lam]]
            if not grid:
                continue
            ests = [_estimate(config, metric, by_lambda[lam]) for lam in grid]
            mean = np.array([e.value for e in ests])
            low = np.array([e.low if e.n > 1 else e.value for e in ests])
            high = np.array([e.high if e.n > 1 else e.value for e in ests])
            (line,) = ax.plot(grid, mean, marker="o", markersize=4, label=method)
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            for box, style in zip(config.compare, [":", "--", "-.", (0, (1, 3)), (0, (5, 1))] * 4):
                if (method, box) in obs:
                    value = _estimate(config, metric, obs[(method, box)][metric]).value
                    ax.axhline(value, color=line.get_color(), linestyle=style, linewidth=1,
                               label=f"{box} ({method})")
        ax.set_xlabel("lambda (dial box)")
        ax.set_ylabel(_label(metric))
        ax.grid(alpha=0.3)
        if n == 0:
            ax.legend(fontsize=6, ncol=2 if config.compare else 1)
    fig.suptitle(f"Calibration of {config.protocol} ({config.dataset}; mean and 95% CI)")
    fig.tight_layout()
    return fig


def save_figures(folder, config, records: Mapping[str, dict]) -> list:
    if not records:
        return []
    if config.persistence:
        from ctrlsim.experiments.calibrate.persistence import half_life_figure

        return [folder.save_figure(half_life_figure(config, records), "calibration")]
    return [folder.save_figure(calibration_figure(config, records), "calibration")]


# ----------------------------------------------------------------------------- driver hooks

def report(ctx, records) -> list[Block]:
    return render_tables(ctx.config, dict(records))


def figures(ctx, records) -> None:
    save_figures(ctx.folder, ctx.config, dict(records))


def summary(ctx, records) -> dict:
    """The calibration as data (`RunResult.summary`; the audit reads it): per method and metric the
    dial curve with its intervals and the resolution; per compared box its placement on the scale;
    the known answers at lambda 0; each method's validity card."""
    from ctrlsim.experiments import validity_card as VC

    config, records = ctx.config, dict(records)
    if config.persistence:
        from ctrlsim.experiments.calibrate.persistence import persistence_summary

        return persistence_summary(config, records)
    obs = observations(records)
    curves: dict[str, dict] = {}
    resolutions: dict[str, dict] = {}
    placement: dict[str, dict] = {}
    for method in config.all_methods:
        for metric in config.metrics:
            by_lambda = curve(config, obs, method, metric)
            grid = [lam for lam in config.grid if lam in by_lambda]
            estimates = [_estimate(config, metric, by_lambda[lam]) for lam in grid]
            curves.setdefault(method, {})[metric] = {"lambda": grid,
                                                      "estimates": [e.to_dict() for e in estimates]}
            res = resolution(by_lambda)
            resolutions.setdefault(method, {})[metric] = {
                "value": res.value, "steps": [{"delta": s.delta, "told_apart": s.told_apart, "pairs": s.pairs,
                                               "max_p": s.max_p} for s in res.steps]}
            if metric != config.metrics[0]:
                continue
            for box in config.compare:
                if (method, box) not in obs:
                    continue
                box_est = _estimate(config, metric, obs[(method, box)][metric])
                if res.value is None:
                    text, lam = "no scale: the method does not resolve the dial", None
                else:
                    text, lam = match_lambda(grid, estimates, box_est)
                placement.setdefault(box, {})[method] = {"metric": metric, "box": box_est.to_dict(),
                                                         "text": text, "lambda": lam}
    known = known_rows(config, records, obs)
    episodes = [e for r in records.values() for e in r.get("episodes_validity", [])]
    return {"protocol": config.protocol, "validity": {m: c.to_dict() for m, c in VC.cards(episodes).items()},
            "methods": list(config.all_methods), "metrics": list(config.metrics), "grid": list(config.grid),
            "seeds": list(config.seeds), "compare": list(config.compare), "curves": curves,
            "resolution": resolutions, "placement": placement,
            "known_answers": {"title": "table", "header": KNOWN_HEADER, "rows": known} if known else None}
