"""A run against its rerun, as data: how far each observation moved, which paired verdicts flipped, and
the smallest effect each paired comparison can detect (`compare`), and the report's blocks (`blocks`).

Input: the score rows (`ctrlsim.experiments.scores`) of both runs. A row of the run pairs with the
rerun's row of the same (key, method, box, observation, metric); rerun spec names are first mapped
back to the run's (`renames`), since a changed LLM spec can be part of a key or a box.

* Per metric, over the matched rows whose values are both defined: n, the share exactly equal, and
  the mean, median, 90th percentile and maximum of |run - rerun|.
* Per (box, metric), every method against the reference method on the observations both hold in
  both runs: the paired comparison (`metrics.stats.paired_comparison`) in the run and in the rerun.
  A verdict is (p < 0.05 by the two-sided Wilcoxon test, the sign of the mean difference); it
  flips when the rerun's differs (a change of significance, of sign, or both).
* The minimum detectable effect at 80% power of each comparison (`metrics.power`): from the run's
  paired spread, from the rerun's, and from the noise: the standard deviation of run - rerun over
  the comparison's values (the method's and the reference's, on its pairs). That spread is what
  the paired differences of two methods that differ only by rerun noise would show, so the noise
  MDE is the smallest true difference a paired test on this many pairs would detect if rerun noise
  were all the spread: a difference below it is within the noise floor.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ctrlsim.experiments.tables import Block, Table, Text

if TYPE_CHECKING:
    import pandas as pd

ALPHA = 0.05
POWER = 0.8
MATCH = ["key", "method", "box", "observation", "metric"]


def _finite(x: Any) -> float | None:
    """A float for JSON: None where undefined."""
    return None if x is None or not math.isfinite(float(x)) else float(x)


def renamed(frame: pd.DataFrame, renames: Mapping[str, str]) -> pd.DataFrame:
    """`frame` with every rerun spec in `renames` written as the run's in its keys and boxes."""
    if not renames or not len(frame):
        return frame
    frame = frame.copy()
    for column in ("key", "box"):
        values = frame[column].astype(str)
        for after in sorted(renames, key=len, reverse=True):  # a longer spec first: one may contain another
            values = values.str.replace(after, renames[after], regex=False)
        frame[column] = values
    return frame


def matched(run: pd.DataFrame, rerun: pd.DataFrame) -> pd.DataFrame:
    """Every row of either run with `value_run` and `value_rerun` (NaN where that run lacks the row)."""
    import pandas as pd

    def values(frame: pd.DataFrame, name: str) -> pd.DataFrame:
        if not len(frame):
            return pd.DataFrame(columns=[*MATCH, "share", name])
        return frame.groupby(MATCH, sort=False, as_index=False).agg(share=("share", "first"),
                                                                    **{name: ("value", "mean")})

    both = values(run, "value_run").merge(values(rerun, "value_rerun").drop(columns="share"), on=MATCH,
                                          how="outer", indicator=True, sort=False)
    both["value_run"] = both["value_run"].astype(float)
    both["value_rerun"] = both["value_rerun"].astype(float)
    return both


def difference_summary(rows: pd.DataFrame) -> dict[str, Any]:
    """|run - rerun| of one metric's matched rows (see the module docstring)."""
    import numpy as np

    paired = rows[rows["_merge"] == "both"]
    defined = paired[np.isfinite(paired["value_run"]) & np.isfinite(paired["value_rerun"])]
    gaps = (defined["value_run"] - defined["value_rerun"]).abs().to_numpy(dtype=float)
    out: dict[str, Any] = {"rows": int(len(gaps)), "only_in_run": int((rows["_merge"] == "left_only").sum()),
                           "only_in_rerun": int((rows["_merge"] == "right_only").sum()),
                           "undefined": int(len(paired) - len(defined))}
    if len(gaps):
        out.update(equal_share=float(np.mean(gaps == 0)), mean=float(gaps.mean()),
                   median=float(np.median(gaps)), p90=float(np.percentile(gaps, 90)), max=float(gaps.max()))
    else:
        out.update(equal_share=None, mean=None, median=None, p90=None, max=None)
    return out


def verdict(comparison) -> tuple[bool, int]:
    """(p < 0.05, the sign of the mean difference) of a paired comparison; an undefined p (no
    non-zero difference) is not significant."""
    p, mean = comparison.p_wilcoxon, comparison.difference.value
    significant = bool(p == p and p < ALPHA)
    return significant, int((mean > 0) - (mean < 0)) if mean == mean else 0


def verdict_text(significant: bool, sign: int) -> str:
    direction = {1: "higher", -1: "lower", 0: "equal"}[sign]
    return direction if significant else f"n.s. ({direction})"


def flip_kind(run: tuple[bool, int], rerun: tuple[bool, int]) -> str | None:
    """None when the verdicts agree, else what changed: significance, sign, or both."""
    changed = [name for name, a, b in (("significance", run[0], rerun[0]), ("sign", run[1], rerun[1]))
               if a != b]
    return " and ".join(changed) or None


def _comparison_dict(cmp) -> dict:
    significant, sign = verdict(cmp)
    return {"difference": cmp.difference.to_dict(), "p_wilcoxon": _finite(cmp.p_wilcoxon), "n": cmp.n,
            "wins": cmp.wins, "losses": cmp.losses, "mde": _finite(cmp.mde),
            "verdict": {"significant": significant, "sign": sign}}


def comparisons(rows: pd.DataFrame, reference: str | None, order: Sequence[str] = ()) -> list[dict]:
    """Every method against the reference per (box, metric), in the run and the rerun (see the module
    docstring); methods in `order` (the run's), then any other; `reference` None: each box's first."""
    import numpy as np

    from ctrlsim.metrics.power import minimum_detectable_effect
    from ctrlsim.metrics.stats import paired_comparison

    defined = np.isfinite(rows["value_run"]) & np.isfinite(rows["value_rerun"])
    paired = rows[(rows["_merge"] == "both") & defined]
    out = []
    for (box, metric), cell in paired.groupby(["box", "metric"], sort=False):
        present = set(cell["method"])
        methods = [m for m in order if m in present] + sorted(present - set(order))
        ref = reference if reference is not None else methods[0]
        if ref not in methods:
            continue
        # one value per observation (several units observing the same one are averaged)
        by_method = {m: part.groupby("observation", sort=False)[["value_run", "value_rerun"]].mean()
                     for m, part in cell.groupby("method", sort=False)}
        base = by_method[ref]
        for method in methods:
            if method == ref:
                continue
            mine = by_method[method]
            shared = [o for o in mine.index if o in base.index]
            if not shared:
                continue
            a, b = mine.loc[shared], base.loc[shared]
            in_run = paired_comparison(a["value_run"].tolist(), b["value_run"].tolist())
            in_rerun = paired_comparison(a["value_rerun"].tolist(), b["value_rerun"].tolist())
            noise = np.concatenate([(a["value_run"] - a["value_rerun"]).to_numpy(dtype=float),
                                    (b["value_run"] - b["value_rerun"]).to_numpy(dtype=float)])
            noise_sd = float(noise.std(ddof=1)) if noise.size > 1 else float("nan")
            noise_mde = minimum_detectable_effect(noise_sd, len(shared), alpha=ALPHA, power=POWER)
            run_dict, rerun_dict = _comparison_dict(in_run), _comparison_dict(in_rerun)
            kind = flip_kind(verdict(in_run), verdict(in_rerun))
            out.append({"box": str(box), "metric": str(metric), "method": str(method),
                        "reference": str(ref), "pairs": len(shared), "run": run_dict, "rerun": rerun_dict,
                        "flipped": kind is not None, "flip": kind, "noise_sd": _finite(noise_sd),
                        "noise_mde": _finite(noise_mde)})
    return out


def compare(run: pd.DataFrame, rerun: pd.DataFrame, *, reference: str | None = None,
            renames: Mapping[str, str] | None = None) -> dict:
    """The comparison of two runs' score frames (JSON-able; see the module docstring)."""
    rows = matched(run, renamed(rerun, renames or {}))
    methods = list(dict.fromkeys(run["method"]))
    tests = comparisons(rows, reference, methods)
    # In the run's order of boxes, metrics and methods (the merge above sorts its keys).
    rank = {column: {v: n for n, v in enumerate(dict.fromkeys(run[column]))} for column in ("box", "metric")}
    tests.sort(key=lambda t: (rank["box"].get(t["box"], len(rank["box"])),
                              rank["metric"].get(t["metric"], len(rank["metric"])), methods.index(t["method"])
                              if t["method"] in methods else len(methods)))
    metrics = {}
    for metric in [*dict.fromkeys(run["metric"]), *sorted(set(rows["metric"]) - set(run["metric"]))]:
        summary = difference_summary(rows[rows["metric"] == metric])
        mine = [t for t in tests if t["metric"] == metric]
        summary.update(share=bool(rows.loc[rows["metric"] == metric, "share"].fillna(False).any()),
                       tests=len(mine), flipped=sum(t["flipped"] for t in mine))
        metrics[str(metric)] = summary
    flipped = [t for t in tests if t["flipped"]]
    return {"reference": reference, "metrics": metrics, "comparisons": tests,
            "tests": len(tests), "flipped": len(flipped),
            "flipped_share": len(flipped) / len(tests) if tests else None}


# ----------------------------------------------------------------------------- the report's blocks

DIFFERENCES_NOTE = (
    "A row is one observation of one method on one box (its unit key, method, box, observation and metric), "
    "paired with the rerun's row of the same; |Δ| = |run - rerun| in the metric's own units (shares as "
    "fractions in [0, 1]). A paired test is a method against the reference on one box (the table below).")
VERDICTS_NOTE = (
    "Δ = mean of method - reference over the pairs (the same observations in both runs); p = two-sided "
    "Wilcoxon signed-rank; a verdict is (p < 0.05, the sign of Δ): higher/lower when significant, n.s. "
    "otherwise; flipped names what changed. MDE = the smallest true mean difference a two-sided paired t "
    "test on these pairs finds 80% of the time: from the run's paired spread, the rerun's, and the noise "
    "(the spread of run - rerun over the pairs' values: what two methods differing only by rerun noise "
    "would show). A difference below the noise MDE is within the noise floor.")
CANNOT_SHOW = (
    "What this cannot show: it measures one rerun on this machine, with this code and these libraries. A "
    "noise of exactly 0 (greedy decoding, exact numerics) says the pipeline is deterministic at this batch "
    "layout, not that another machine, thread count or library version gives the same numbers; what every "
    "run shares (dataset, box weights, bundled models, text-encoder embeddings) was not recomputed. Seeds, "
    "targets and users are the same in both runs: the noise floor is not the run's sampling uncertainty, "
    "which the intervals of its own tables give (docs/statistics.md).")


def _num(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.4f}"


def _p(x: float | None) -> str:
    return "undefined" if x is None else f"{x:.3g}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _verdict_cell(side: Mapping) -> str:
    v = side["verdict"]
    return verdict_text(v["significant"], v["sign"])


def _mde(value: float | None) -> str:
    return "n/a (one pair)" if value is None else f"{value:.4g}"


def change_lines(about: Mapping) -> list[str]:
    """What the rerun changed, one bullet each."""
    changed = about["changed"]
    lines = [f"- unit order: each wave's units shuffled with seed {changed['unit_order_seed']} (a unit is a "
             "pure function of its config and key: the order changes no record, only the batch layout)"]
    for spec in changed["specs"]:
        if spec["changed"]:
            lines.append(f"- {spec['field']}: `{spec['before']}` -> `{spec['after']}` ({spec['why']})")
        elif spec["before"] is None:
            lines.append(f"- {spec['field']}: {spec['why']}")
        else:
            lines.append(f"- {spec['field']}: `{spec['before']}` unchanged ({spec['why']})")
    if not changed["specs"]:
        lines.append("- no LLM spec in the config: only the unit order changed")
    lines.append(f"- executor: {changed['executor']}")
    caches = about["caches"]
    lines.append(f"- response cache: none shared with the run; LLM replies: {caches['llm_replies']}; "
                 f"personas: {caches['personas']}")
    lines.append(f"- still shared: {caches['shared_by_every_run']}")
    differences = about.get("provenance_differences") or []
    if differences:
        lines.append("- **not only noise**: the rerun's recorded code or inputs differ from the run's, so "
                     "its differences include these changes: " + "; ".join(differences))
    else:
        lines.append("- code, libraries and input files: the same as the run's (provenance)")
    return lines


def differences_table(metrics: Mapping[str, Mapping]) -> Table:
    """Per metric: |run - rerun| over the matched rows, and how many paired verdicts flipped."""
    rows = []
    for metric, m in metrics.items():
        flipped = f"{m['flipped']} ({_share(m['flipped'] / m['tests'])})" if m["tests"] else "-"
        rows.append([metric, m["rows"], _share(m["equal_share"]), _num(m["mean"]), _num(m["median"]),
                     _num(m["p90"]), _num(m["max"]), m["tests"], flipped])
    left = [f"{metric}: {m['only_in_run']} row(s) only in the run, {m['only_in_rerun']} only in the rerun, "
            f"{m['undefined']} undefined in either" for metric, m in metrics.items()
            if m["only_in_run"] or m["only_in_rerun"] or m["undefined"]]
    note = f" Left out: {'; '.join(left)}." if left else ""
    return Table.of("Rerun |difference| per observation", rows,
                    ["Metric", "rows", "exactly equal", "mean |Δ|", "median |Δ|", "90th pct |Δ|", "max |Δ|",
                     "paired tests", "verdicts flipped"], after=DIFFERENCES_NOTE + note)


def verdicts_table(tests: Sequence[Mapping]) -> Table:
    """Every paired comparison in the run and the rerun, with its three MDEs; the range of the MDEs
    is printed beneath it."""
    rows = [[t["box"], t["metric"], t["method"], t["reference"], t["pairs"],
             _signed(t["run"]["difference"]["value"]), _p(t["run"]["p_wilcoxon"]), _verdict_cell(t["run"]),
             _signed(t["rerun"]["difference"]["value"]), _p(t["rerun"]["p_wilcoxon"]),
             _verdict_cell(t["rerun"]), t["flip"] or "no", _mde(t["run"]["mde"]), _mde(t["rerun"]["mde"]),
             _mde(t["noise_mde"])] for t in tests]
    beneath = ""
    own = [t["run"]["mde"] for t in tests if t["run"]["mde"] is not None]
    noise = [t["noise_mde"] for t in tests if t["noise_mde"] is not None]
    if own:
        beneath = f" Minimum detectable effect (80% power, p < 0.05) from the run's own spread: " \
                  f"{_num(min(own))} to {_num(max(own))}"
        beneath += f"; from the noise: {_num(min(noise))} to {_num(max(noise))}." if noise else "."
    return Table.of("Paired verdicts: run vs rerun", rows,
                    ["Box", "Metric", "Method", "vs", "pairs", "Δ run", "p run", "verdict run", "Δ rerun",
                     "p rerun", "verdict rerun", "flipped", "MDE run", "MDE rerun", "MDE noise"],
                    after=VERDICTS_NOTE + beneath)


def flips_text(tests: Sequence[Mapping], share: float | None) -> Text:
    flipped = [t for t in tests if t["flipped"]]
    if not flipped:
        return Text(f"No paired verdict flipped (0 of {len(tests)}).")
    lines = [f"- {t['box']} / {t['metric']}: {t['method']} vs {t['reference']}: {_verdict_cell(t['run'])} "
             f"(p {_p(t['run']['p_wilcoxon'])}) -> {_verdict_cell(t['rerun'])} "
             f"(p {_p(t['rerun']['p_wilcoxon'])}); {t['flip']} changed" for t in flipped]
    head = f"{len(flipped)} of {len(tests)} paired verdicts flipped ({_share(share)}):"
    return Text(head + "\n\n" + "\n".join(lines))


def blocks(about: Mapping, analysis: Mapping) -> list[Block]:
    """The noise report (noise.md) as Table and Text blocks."""
    out: list[Block] = [Text(
        f"# Noise floor: {about['runner']} run rerun\n\n"
        f"run `{about['run']}` ({about['run_records']} finished units), rerun `{about['rerun']}` "
        f"({about['rerun_records']} units). The rerun changed:\n\n" + "\n".join(change_lines(about)))]
    out.append(differences_table(analysis["metrics"]))
    tests = analysis["comparisons"]
    if tests:
        out += [verdicts_table(tests), flips_text(tests, analysis["flipped_share"])]
    else:
        out.append(Text("No paired test: no box holds a second method beside the reference on the same "
                        "observations; only the per-observation differences above are measured."))
    out.append(Text(CANNOT_SHOW))
    return out


def noise_json(about: Mapping, analysis: Mapping, report: Sequence[Block]) -> dict:
    """noise.json: what was rerun and changed, the numbers, and the report's tables as data."""
    from ctrlsim.experiments.tables import tables_json

    return {**about, "analysis": analysis, "report": tables_json(report)}
