"""pass^k of control on the dial, with its known answers (a ctrlbench calibration).

A task is (method, box, target); its tries are the seeds; a try succeeds when the episode's
Coverage at the last round reaches `success_threshold` (ctrlbench's own rule). Two answers are
known before anything runs:

* lambda = 1 with the oracle: the dial follows the likes and the oracle likes every target it is
  shown, so at the default sizes every episode clears the bar: pass^k = 1 for every k (the
  threshold is chosen so; a run at other sizes that misses it says the bar is out of reach there);
* lambda = 0: the box ignores the user and ranks a fixed list, so an episode's Coverage cannot
  exceed the fixed ranking's exposure of its target (recorded per observation as the known
  exposure), and the oracle's equals it. Whether each try can succeed is therefore known: the
  oracle's pass^k equals the pass^k of those known successes, every other method's is at most it.
"""
from __future__ import annotations

from typing import Mapping

from ctrlsim.experiments.tables import Table
from ctrlsim.metrics.passk import PassK, pass_k_curve, shown_ks, success_flags
from ctrlsim.recommenders.dial import format_lambda

EXACT = 1e-9


def _task_of(obs_id: str) -> tuple[int, str]:
    """(seed, target) of a ctrlbench observation id `seed=N/<target>`."""
    seed, _, target = obs_id.partition("/")
    return int(seed.removeprefix("seed=")), target


def outcomes(values: Mapping[str, float], threshold_pct: float) -> dict[str, list[bool]]:
    """target -> success flag per seed (seed order) from observation id -> Coverage (%)."""
    return success_flags(((target, seed, value) for (seed, target), value in
                          ((_task_of(obs_id), value) for obs_id, value in values.items())), threshold_pct)


def _cells(curve: PassK, ks: list[int]) -> list[str]:
    return [f"{curve.values[k]:.2f} [{curve.low[k]:.2f}, {curve.high[k]:.2f}]" if curve.tasks > 1
            else f"{curve.values[k]:.2f}" for k in ks]


def known_pass_k(config, method: str, lam: float, records: Mapping[str, dict],
                 observed: Mapping[str, float]) -> tuple[str, PassK | None, str] | None:
    """(what pass^k must be, the curve it must equal or bound, "=" or "<=") at a known point, or None."""
    threshold = 100 * config.success_threshold
    if lam == 1.0 and method == "oracle":
        return "1 for every k (the oracle on a box that follows its likes)", None, "="
    if lam != 0.0:
        return None
    known: dict[str, float] = {}
    for record in records.values():
        if record["method"] == method and record["box"] == config.dial_box(0.0):
            known.update(record.get("known", {}).get("exposure", {}))
    common = {o: known[o] for o in observed if o in known}
    if not common:
        return None
    relation = "=" if method == "oracle" else "<="
    return (f"{relation} the fixed ranking's pass^k", pass_k_curve(outcomes(common, threshold)), relation)


def pass_k_table(config, obs, records: Mapping[str, dict], names: Mapping[str, str] | None = None) -> Table:
    """pass^k per method on every box of the calibration, with the known answers at lambda 0 and 1."""
    threshold = 100 * config.success_threshold
    ks = shown_ks(len(config.seeds))
    rows = []
    boxes = [(config.dial_box(lam), lam) for lam in config.grid] + [(box, None) for box in config.compare]
    for method in config.all_methods:
        for box, lam in boxes:
            values = obs.get((method, box), {}).get("coverage", {})
            if not values:
                continue
            curve = pass_k_curve(outcomes(values, threshold))
            shown = [k for k in ks if k in curve.values]
            cells = _cells(curve, shown) + ["-"] * (len(ks) - len(shown))
            label = f"lambda = {format_lambda(lam)}" if lam is not None else box
            answer = known_pass_k(config, method, lam, records, values) if lam is not None else None
            if answer is None:
                known, holds = "none known", "-"
            else:
                text, expected, relation = answer
                want = {k: 1.0 for k in curve.values} if expected is None else expected.values
                gaps = [curve.values[k] - want[k] for k in curve.values if k in want]
                ok = all(abs(g) <= EXACT for g in gaps) if relation == "=" else all(g <= EXACT for g in gaps)
                known = text if expected is None else \
                    f"{text}: " + ", ".join(f"{want[k]:.2f}" for k in shown if k in want)
                holds = "yes" if ok else "NO"
            rows.append([(names or {}).get(method, method), label, curve.tasks, curve.trials, *cells,
                         f"{curve.cliff:+.2f}", known, holds])
    header = ["Method", "Box", "tasks", "tries", *(f"pass^{k}" for k in ks), "cliff pass^1 - pass^n",
              "Known answer", "Holds"]
    share = f"{100 * config.success_threshold:g}%"
    note = (f"A task is (method, box, target); its tries are the seeds, a try succeeds when Coverage at "
            f"the last round reaches {share} (`--success-threshold`). pass^k = mean over tasks of C(c, k) / "
            "C(n, k): the chance that k tries all succeed, with a 95% bootstrap interval over tasks (none "
            "with one task). Known answers: the oracle at lambda = 1 succeeds every time; at lambda = 0 a "
            "try can succeed only where the fixed ranking's exposure of the target reaches the bar (the "
            "oracle's pass^k equals that, every other method's is at most it). A 'NO' means the instrument "
            "or the bar is off at these sizes (docs/statistics.md, \"pass^k\").")
    return Table.of(f"pass^k of control (success: Coverage >= {share} at t = {config.rounds})", rows, header,
                    after=note)
