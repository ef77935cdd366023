"""ctrlbench's pass^k table: how reliably each method reaches control on a box, not just how often.

A task is (method, box, target); its seeds are its tries, and a try succeeds when the episode's
Coverage at the last round reaches `success_threshold`. pass^k (`ctrlsim.metrics.passk`) is the
chance that k tries of a task all succeed, averaged over the method's tasks on the box, with a
bootstrap interval over tasks; the cliff pass^1 - pass^n is how much of the success rate is luck.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from ctrlsim.experiments.ctrlbench.tables import method_labels
from ctrlsim.experiments.scores import Scores
from ctrlsim.experiments.tables import Table
from ctrlsim.metrics.passk import pass_k_curve


def outcomes(config, records: Mapping[str, dict]) -> dict[tuple[str, str], dict[str, list[bool]]]:
    """(box, method) -> target -> success flag per seed, in seed order."""
    found: dict[tuple[str, str], dict[str, list[tuple[int, bool]]]] = defaultdict(lambda: defaultdict(list))
    for record in records.values():
        curve = record["curves"]["coverage"]
        reached = bool(curve) and curve[-1] >= config.success_threshold
        found[(record["recommender"], record["method"])][record["target"]].append((record["seed"], reached))
    return {cell: {target: [ok for _, ok in sorted(tries)] for target, tries in by_target.items()}
            for cell, by_target in found.items()}


def pass_k_table(config, records: Mapping[str, dict]) -> Table:
    """pass^k for k = 1..seeds per box x method, with intervals and the cliff."""
    labels = method_labels(records)
    cells = outcomes(config, records)
    width = len(config.seeds)
    header = ["Black-Box", "Method", "tasks", "tries"] + [f"pass^{k}" for k in range(1, width + 1)] + \
        ["cliff pass^1 - pass^n"]
    rows = []
    for box in config.recommenders:
        for method in config.all_methods:
            tasks = cells.get((box, method))
            if not tasks:
                continue
            curve = pass_k_curve(tasks)
            row = [box, labels.get(method, method), curve.tasks, curve.trials]
            for k in range(1, width + 1):
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


SCORES = Scores(rows=score_rows, headline=lambda config: "coverage")
