"""ctrlbench's pass^k table: how reliably each method reaches control on a box, not just how often.

A task is (method, box, target); its seeds are its tries, and a try succeeds when the episode's
Coverage at the last round reaches `success_threshold`. pass^k (`ctrlsim.metrics.passk`) is the
chance that k tries of a task all succeed, averaged over the method's tasks on the box, with a
bootstrap interval over tasks; the cliff pass^1 - pass^n is how much of the success rate is luck.
"""
from __future__ import annotations

from typing import Mapping

from ctrlsim.experiments.ctrlbench.tables import method_labels
from ctrlsim.experiments.scores import Scores
from ctrlsim.experiments.tables import Table
from ctrlsim.metrics.passk import pass_k_curve, shown_ks, success_flags


def outcomes(config, records: Mapping[str, dict]) -> dict[tuple[str, str], dict[str, list[bool]]]:
    """(box, method) -> target -> success flag per seed, in seed order."""
    tries = ((((r["recommender"], r["method"]), r["target"]), r["seed"],
              r["curves"]["coverage"][-1] if r["curves"]["coverage"] else 0.0)
             for r in records.values())
    flags = success_flags(tries, config.success_threshold)
    out: dict[tuple[str, str], dict[str, list[bool]]] = {}
    for (cell, target), seen in flags.items():
        out.setdefault(cell, {})[target] = seen
    return out


def pass_k_table(config, records: Mapping[str, dict]) -> Table:
    """pass^k for k = 1..seeds per box x method, with intervals and the cliff."""
    labels = method_labels(records)
    cells = outcomes(config, records)
    ks = shown_ks(len(config.seeds))
    header = ["Black-Box", "Method", "tasks", "tries"] + [f"pass^{k}" for k in ks] + ["cliff pass^1 - pass^n"]
    rows = []
    for box in config.recommenders:
        for method in config.all_methods:
            tasks = cells.get((box, method))
            if not tasks:
                continue
            curve = pass_k_curve(tasks)
            row = [box, labels.get(method, method), curve.tasks, curve.trials]
            for k in ks:
                row.append(f"{curve.values[k]:.2f} [{curve.low[k]:.2f}, {curve.high[k]:.2f}]"
                           if k in curve.values and curve.tasks > 1 else
                           f"{curve.values[k]:.2f}" if k in curve.values else "-")
            rows.append(row + [f"{curve.cliff:+.2f}"])
    share = f"{100 * config.success_threshold:g}%"
    return Table.of(f"pass^k of control (success: Coverage >= {share} at t = {config.rounds})", rows, header,
                    after=f"A task is (method, box, target); its tries are the seeds, and a try succeeds "
                          f"when Coverage at the last round reaches {share} (`--success-threshold`). pass^k "
                          "= mean over tasks of C(c, k) / C(n, k) for c successes in n tries (the unbiased "
                          "estimator of tau-bench): the chance that k tries all succeed; [low, high] is a "
                          "95% bootstrap interval over tasks (none with one task). A cliff near 0 means "
                          "control is reliable; a large one, that success is luck (docs/statistics.md).")


def score_rows(config, records: Mapping[str, dict]):
    """Each episode's Coverage share at its last round (`ctrlsim.experiments.scores`): the figure a
    task's success, a noise run and a probe-model sensitivity analysis read."""
    for key, record in records.items():
        curve = record["curves"]["coverage"]
        yield {"key": key, "method": record["method"], "box": record["recommender"],
               "observation": f"{record['target']}|seed={record['seed']}", "seed": record["seed"],
               "metric": "coverage", "value": curve[-1] if curve else 0.0, "share": True}


SCORES = Scores(rows=score_rows, headline=lambda config: "coverage",
                reference=lambda config: config.reference_method)
