"""The audit's sentences: headline scores, where a box sits on the dial's scale, and the caveats.

Pure functions of the summary's numbers (no I/O), so the words always say what the numbers say.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

LABELS = {"base-small": "the LLM probes (Base-Small)", "oracle": "the oracle probe (upper bound)",
          "random": "the coin-flip probe (floor)", "template": "the template edits",
          "stronger": "the stronger template edits", "weaker": "the weaker template edits",
          "b0": "the cued lists as generated (B0)"}
# How a dial box at lambda follows the user, per protocol ({amount}: "about 30%", "almost none (under 5%)").
WHAT = {"ctrlbench": "personalises {amount} of its slate positions",
        "steereval": "gives the profile text {amount} of the weight in its scores",
        "promptshift": "replaces {amount} of its list positions with the cued slice's items"}


def _ci(e: Mapping[str, Any], digits: int = 2, unit: str = "") -> str:
    if e is None or e.get("value") is None:
        return "n/a"
    value = f"{e['value']:.{digits}f}{unit}"
    if e.get("low") is None:
        return f"{value} (one observation: no interval)"
    return f"{value} (95% CI {e['low']:.{digits}f} to {e['high']:.{digits}f}{unit})"


# The placement interval (in lambda) an audit aims for per probe: a scripted reference (the oracle,
# template edits, PromptShift's rerankers) costs milliseconds a unit, so it can afford the seeds for
# a quarter of the dial; an LLM probe half.
SCRIPTED_REFERENCES = ("oracle", "random", "template", "stronger", "weaker", "b0", "b1", "b2", "b3")
WANTED_WIDTH = {method: 0.25 for method in SCRIPTED_REFERENCES}
WANTED_WIDTH_LLM = 0.5


def precision_words(method: str, interval: str, seeds: int | None) -> str:
    """Whether a placement interval is as narrow as the audit aims for, with the numbers, and how
    many seeds would get there where it is not (width shrinks about as 1 / sqrt(seeds))."""
    wanted = WANTED_WIDTH.get(method, WANTED_WIDTH_LLM)
    if "no overlap" in interval:
        return "; the intervals do not overlap, so the placement is resolved"
    if not interval.startswith("["):
        return ""
    low, high = (float(x) for x in interval.strip("[]").split(","))
    width = high - low
    if width <= wanted:
        return f"; interval width {width:.2f} <= {wanted:g}, as precise as the audit aims for"
    more = ""
    if seeds:
        needed = math.ceil(seeds * (width / wanted) ** 2)
        more = f"; about {needed} seeds instead of {seeds} would narrow it to {wanted:g}"
    return f"; interval width {width:.2f} > {wanted:g} wanted: not reachable at this size{more}"


def placement_words(protocol: str, box: str, method: str, text: str, lam: float | None,
                    seeds: int | None = None) -> str:
    """One plain sentence for a box's place on the lambda scale, for one probe method, with whether
    its interval is as narrow as the audit aims for (`WANTED_WIDTH`)."""
    who = LABELS.get(method, method)
    if text.startswith("no scale"):
        return (f"{who} could not tell a box that ignores the user from one that follows it, so they "
                f"cannot place {box} on the scale")
    interval = text[text.find("["):] if "[" in text else ""
    vague = ""
    if interval.startswith("[") and "no overlap" not in interval:
        low, high = (float(x) for x in interval.strip("[]").split(","))
        if high - low >= 0.9:
            vague = "; the interval spans the whole scale, so this placement says little"
    precise = precision_words(method, interval, seeds)
    if text.startswith("below"):
        return (f"to {who}, {box} responded less than a reference box that ignores the user "
                f"(below lambda = 0; interval {interval}{vague}{precise})")
    if text.startswith("above"):
        return f"to {who}, {box} responded more than the most controllable reference box ({text}{precise})"
    if lam is None:
        return f"to {who}, {box}: {text}"
    amount = f"about {lam:.0%}" if lam >= 0.05 else "almost none (under 5%)"
    how = WHAT.get(protocol, "follows the user {amount}").format(amount=amount)
    return f"to {who}, {box} responded like a reference box that {how} (lambda {text}{vague}{precise})"


def whole_dial_words(cal: Mapping[str, Any], method: str) -> str:
    """The whole-dial step of a method that resolved nothing, in numbers: its metric at both ends of
    the grid with intervals, and the step test's p over how many paired observations."""
    metric = cal["metrics"][0]
    curve = cal["curves"][method][metric]
    estimates = curve["estimates"]
    steps = cal["resolution"][method][metric]["steps"]
    if len(estimates) < 2 or not steps:
        return f"{method}: too few dial points measured"
    whole = max(steps, key=lambda step: step["delta"])
    first, last = curve["lambda"][0], curve["lambda"][-1]
    return (f"{method}: {metric} {_ci(estimates[0], _digits(estimates[0]))} at lambda {first:g} and "
            f"{_ci(estimates[-1], _digits(estimates[-1]))} at lambda {last:g}; the paired test of that whole "
            f"step gave p = {whole['max_p']:.2g} over {estimates[0].get('n')} observations per lambda")


def _digits(e: Mapping[str, Any]) -> int:
    """4 decimals for small values (ΔAUC_t, Drift), 2 for percentages."""
    return 4 if e.get("value") is not None and abs(e["value"]) < 1 else 2


FAILED_CARD = " (failed its validity card: not evidence about the box)"


def card_passes(numbers: Mapping[str, Any] | None, method: str) -> bool | None:
    """Whether `method`'s probe validity card passed in a sub-run's numbers (None: no card stored)."""
    card = ((numbers or {}).get("validity") or {}).get(method)
    if not card or not (card.get("adherence") or {}).get("n"):
        return None
    return bool(card["passes"])


def validity_lines(summary: Mapping[str, Any]) -> list[str]:
    """The first screen's words on the probes themselves: which passed their card, which failed, why
    that matters."""
    lines: list[str] = []
    for name, entry in summary["subruns"].items():
        numbers = (entry or {}).get("numbers") or {}
        cards = numbers.get("validity") or {}
        if not cards:
            continue
        passed = [LABELS.get(m, m) for m, c in cards.items() if c["passes"]]
        failed = [(m, c) for m, c in cards.items() if not c["passes"] and (c.get("adherence") or {}).get("n")]
        text = f"Probe validity ({name}): "
        text += (f"{', '.join(passed)} passed (adherence interval above 0)" if passed else "no probe passed")
        if failed:
            text += "; " + "; ".join(f"{LABELS.get(m, m)} failed: adherence {_ci(c['adherence'])}, likes of "
                                     f"targets {_pct(c['adherence'].get('like_target'))} vs others "
                                     f"{_pct(c['adherence'].get('like_other'))}" for m, c in failed)
            text += (". A probe that fails its card cannot be told from one that ignores its goal, so its "
                     "scores and differences say nothing about the box; read the passing probes' numbers")
        lines.append(text + ".")
    return lines


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def headline(summary: Mapping[str, Any]) -> list[dict]:
    """A few headline scores with their 95% intervals, and the placements, one dict each; the probes
    whose validity card passed come first, the others are marked (`FAILED_CARD`)."""
    out: list[dict] = []
    subruns = summary["subruns"]
    cb = (subruns.get("ctrlbench") or {}).get("numbers")
    if cb:
        rounds = cb["rounds"]
        methods = sorted(cb["methods"], key=lambda m: card_passes(cb, m) is False)
        for box in cb["boxes"]:
            for method in methods:
                e = cb["coverage"].get(box, {}).get(method)
                if e is None:
                    continue
                valid = card_passes(cb, method)
                out.append({"protocol": "ctrlbench", "box": box, "method": method, "metric": "coverage",
                            "estimate": e, "valid": valid,
                            "text": f"{box}: {LABELS.get(method, method)} reached Coverage "
                                    f"{_ci(e, 2, '%')} of the target in {rounds} rounds"
                                    + (FAILED_CARD if valid is False else "")})
    for name in ("calibrate-ctrlbench", "calibrate-steereval", "calibrate-promptshift"):
        cal = (subruns.get(name) or {}).get("numbers")
        if not cal:
            continue
        for box, per_method in cal["placement"].items():
            for method, place in per_method.items():
                out.append({"protocol": name, "box": box, "method": method, "metric": "lambda",
                            "estimate": {"value": place["lambda"], "low": None, "high": None,
                                         "n": place["box"]["n"]},
                            "placement": place["text"], "valid": card_passes(cal, method),
                            "text": place["words"][0].upper() + place["words"][1:]
                            + f"; its {place['metric']} {_ci(place['box'], _digits(place['box']))}"
                            + (FAILED_CARD if card_passes(cal, method) is False else "")})
    se = (subruns.get("steereval") or {}).get("numbers")
    if se:
        for cond, cell in se["conditions"].items():
            out.append({"protocol": "steereval", "box": cond, "method": "template",
                        "metric": "signed_delta_auc",
                        "estimate": cell["signed"],
                        "text": f"SteerEval, {cell.get('box', cond)} ({cond} condition): a profile edit "
                                f"moved the target tag's AUC by "
                                f"{_ci(cell['signed'], 4)} in the asked direction "
                                f"({cell['scenarios']} scenarios)"})
    if cb:
        for row in cb["box_comparison"]:
            p = row["p_wilcoxon"]
            out.append({"protocol": "ctrlbench", "box": row["box"], "method": row["method"],
                        "metric": "coverage_difference", "estimate": row["difference"],
                        "text": f"{row['box']} minus {row['reference']}, "
                                f"{LABELS.get(row['method'], row['method'])}: "
                                f"Coverage {_ci(row['difference'], 2, ' points')}, Wilcoxon p = "
                                f"{'n/a' if p is None else f'{p:.3g}'} over {row['n']} paired episodes"
                                + ("" if row.get("mde") is None else
                                   f" (a difference under {row['mde']:.2f} points could go unseen at this "
                                   "size)")})
    return out


def headline_lines(summary: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The summary screen's few lines: one per box and protocol, the methods' scores side by side."""
    lines: list[str] = validity_lines(summary)
    cb = (summary["subruns"].get("ctrlbench") or {}).get("numbers")
    if cb:
        methods = sorted(cb["methods"], key=lambda m: card_passes(cb, m) is False)  # valid probes lead
        for box in cb["boxes"]:
            parts = [f"{LABELS.get(m, m)} {_ci(cb['coverage'][box][m], 2, '%')}"
                     + (FAILED_CARD if card_passes(cb, m) is False else "") for m in methods
                     if m in cb["coverage"].get(box, {})]
            lines.append(f"CtrlBench-Rec, {box}: Coverage of the target {' + '.join(cb['targets'])} after "
                         f"{cb['rounds']} rounds: " + "; ".join(parts) + ".")
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for e in entries:
        if e["metric"] == "lambda":
            grouped.setdefault((e["protocol"], e["box"]), []).append(e)
    for (protocol, box), items in grouped.items():
        cal = (summary["subruns"].get(protocol) or {}).get("numbers")
        items = sorted(items, key=lambda e: card_passes(cal, e["method"]) is False)  # valid probes lead
        placed = [e for e in items if not e["placement"].startswith("no scale")]
        unresolved = [LABELS.get(e["method"], e["method"]) for e in items
                      if e["placement"].startswith("no scale")]
        text = f"Calibration ({protocol.removeprefix('calibrate-')}), {box}: "
        text += "; ".join(e["text"][0].lower() + e["text"][1:] for e in placed) if placed else \
            "no placement on the lambda scale"
        if unresolved:
            who = ", ".join(unresolved)
            text += (f". {who[0].upper()}{who[1:]}" if placed else f": {who}") + \
                " did not resolve the dial at this size"
        lines.append(text + ".")
    lasting: dict[str, list[Mapping[str, Any]]] = {}  # "Does control last?": one line per box
    for e in entries:
        if e["metric"] == "half_life":
            lasting.setdefault(e["box"], []).append(e)
    lines += [items[0]["lead"] + "; ".join(e["text"] for e in items) + "." for items in lasting.values()]
    lines += [e["text"] + "." for e in entries if e["metric"] in ("signed_delta_auc", "coverage_difference")]
    return lines


def caveats(summary: Mapping[str, Any], small_llms: Sequence[str]) -> list[str]:
    """What limits the audit's numbers, in plain words (small LLM, search, fallbacks, failure rates)."""
    out: list[str] = []
    small = [m for m in summary["audit"].get("llms_ran", []) if m in small_llms]
    if small:
        out.append(f"The LLMs that ran ({', '.join(small)}) are small bundled models: the papers' probes "
                   "and rankers are far larger API models, and a weak probe makes a box look less "
                   "controllable than it is.")
    subruns = summary["subruns"]
    cb = (subruns.get("ctrlbench") or {}).get("numbers")
    if cb:
        out.append("Search was " + (
            "ON: probes could search the catalogue; search likes are counted apart and never as Coverage."
            if cb["allow_search"] else
            "off, as in the paper's evaluation: only likes on slates the box built count."))
        seeds = len(cb["seeds"]) * len(cb["targets"])
        floor = 2 / 2 ** seeds
        out.append(f"{seeds} paired episode(s) per cell: the smallest two-sided Wilcoxon p-value that many "
                   f"pairs can give is {floor:.3g}"
                   + (", so no paired difference can be significant." if floor >= 0.05 else "."))
        for box, per in cb["cost"].items():
            for method, c in per.items():
                if c["decisions"]:
                    out.append(f"{box} / {method}: {c['parse_failures']} of {c['decisions']} LLM decisions "
                               f"failed to parse; {c['template_fallbacks']} of {c['probes']} personas were "
                               f"written from a template; {c['dropped_probes']} probe(s) dropped.")
    for name, entry in subruns.items():
        cal = entry.get("numbers") if name.startswith("calibrate-") else None
        if not cal:
            continue
        unresolved = [m for m in cal["methods"] if cal["resolution"][m][cal["metrics"][0]]["value"] is None]
        if unresolved:
            out.append(f"{name}: {', '.join(unresolved)} did not resolve the dial (no lambda step told "
                       "apart at p < 0.05): their numbers describe the probes, not the box. Why, in numbers: "
                       + "; ".join(whole_dial_words(cal, m) for m in unresolved) + ".")
        known = cal.get("known_answers") or {}
        broken = [row for row in known.get("rows", []) if row and row[-1] == "NO"]
        if broken:
            out.append(f"{name}: {len(broken)} known answer(s) at lambda = 0 did NOT hold: the instrument "
                       "is broken and no number here is evidence.")
    se = (subruns.get("steereval") or {}).get("numbers")
    if se:
        for cond, cell in se["conditions"].items():
            if cell["edit_problems"]:
                out.append(f"SteerEval {cond}: {cell['edit_problems']} of {cell['scenarios']} edits were "
                           "refused or misread by the LLM.")
    return out


# ----------------------------------------------------------------------------- several probe models

def placement_interval(text: str) -> tuple[float, float] | None:
    """The lambda interval of a placement's text ("0.37 [0.25, 0.50]", "below lambda = 0 [0.00, 0.20]"),
    None where it has none ("no scale: ...", "[no overlap]", "-")."""
    import re

    found = re.search(r"\[(-?\d+(?:\.\d+)?), (-?\d+(?:\.\d+)?)\]", text or "")
    return (float(found.group(1)), float(found.group(2))) if found else None


def placement_agreement(box: str, method: str, by_model: Mapping[str, Mapping[str, Any]]) -> dict:
    """Whether `box`'s place on the lambda scale depends on which model played the user, for one probe
    method: `by_model[model]` = that model's placement (`text`, `lambda`). Returns {"verdict", "words"}:
    "depends" (two models' intervals do not overlap), "agree" (every pair overlaps), or "unknown"
    (fewer than two models placed the box)."""
    who = LABELS.get(method, method)
    placed = {m: placement_interval(p.get("text", "")) for m, p in by_model.items()}
    where = "; ".join(f"{m}: {by_model[m].get('text', '-')}" for m in by_model)
    intervals = {m: i for m, i in placed.items() if i is not None}
    head = f"Placement of {box} by {who}"
    if len(intervals) < 2:
        return {"verdict": "unknown",
                "words": f"{head}: whether it depends on the probe model cannot be said, as fewer than two "
                         f"models placed it on the scale ({where})"}
    unplaced = [m for m in placed if m not in intervals]
    missing = f"; {', '.join(unplaced)} placed it nowhere (no scale or no interval)" if unplaced else ""
    names = list(intervals)
    apart = [(a, b) for n, a in enumerate(names) for b in names[n + 1:]
             if intervals[a][1] < intervals[b][0] or intervals[b][1] < intervals[a][0]]
    if apart:
        pairs = ", ".join(f"{a} and {b}" for a, b in apart)
        return {"verdict": "depends",
                "words": f"{head}: it depends on which model played the user; the lambda intervals of "
                         f"{pairs} do not overlap ({where}){missing}"}
    return {"verdict": "agree",
            "words": f"{head}: the models' placements agree within their intervals ({where}); overlapping "
                     f"intervals are no proof that they place it alike{missing}"}


SCRIPTED_PLACEMENT = ("does not use the probe model (identical scores under every model), so its placement "
                      "is the same under every model by construction: no evidence either way")


def sensitivity_lines(name: str, analysis: Mapping[str, Any]) -> list[str]:
    """One line per method of a sub-run's probe-model sensitivity analysis (`sensitivity.report`)."""
    lines = []
    unit = " points" if analysis.get("share") else ""
    scale = 100.0 if analysis.get("share") else 1.0
    for method, e in analysis["methods"].items():
        who = LABELS.get(method, method)
        if e.get("g_coefficient") is not None or "components" in e:
            shares = e["shares"]
            model_share = (shares.get("probe model") or 0) + (shares.get("box x probe model") or 0)
            lines.append(f"{name}, {who}: the box ranking's E rho^2 = {_opt(e['g_coefficient'])}, Kendall's "
                         f"W across probe models = {_opt(e['kendalls_w'])}, {len(e['flips'])} box pair(s) "
                         f"flip between models; the probe model and its interaction with the box hold "
                         f"{model_share:.0%} of the score variance.")
        for p in e.get("paired", []):
            diff = {k: None if p["difference"].get(k) is None else p["difference"][k] * scale
                    for k in ("value", "low", "high")}
            lines.append(f"{name}, {who} on {p['box']}: {p['model']} minus {p['reference']}: "
                         f"{_ci(diff, 2, unit)}, Wilcoxon p = {_opt(p['p_wilcoxon'], 3)} over {p['n']} "
                         "paired observation(s).")
    scripted = list(analysis.get("scripted", {}))
    if scripted:
        who = ", ".join(LABELS.get(m, m) for m in scripted)
        lines.append(f"{name}: {who} gave identical scores under every probe model (they do not use it): no "
                     "evidence either way about the model's effect.")
    return lines


def _opt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
