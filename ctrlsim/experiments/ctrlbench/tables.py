"""The tables of `ctrlsim ctrlbench`, from its episode records, each cell with its uncertainty.

Per episode, `agents.episode.round_curves` gives Task 1's metrics after every round t (Table 5),
counting only likes on recommender slates:
  coverage              |T ∩ ∪_j C_j| / |T|
  efficiency            Σ_j |C_j ∩ T| / |T ∩ ∪_j C_j|  (the paper's code; its tables use this)
  len                   (1/K) Σ_j |C_j|
  tokens                (1/K) Σ_j Tokens_j (evaluation decisions only; setup tokens are apart);
                        a cell with calls whose server sent no token counts says "unknown (...)"

How a cell aggregates its episodes (one episode = one (method, box, target, seed)):
- Coverage, a share: the mean over the cell's episodes with its 95% bootstrap interval (BCa,
  `ctrlsim.metrics.bounded.share_ci`), which stays inside [0, 100]% ("1.40 [0.00, 2.80]"; "[n/a]"
  with one episode; "[x, x]" where every episode had the same value: no spread was seen).
- Len, Tokens and the Task 2 / Task 3 figures: the mean over the cell's episodes with a 95% Student
  t interval over them ("12.5 ± 3.1" = mean ± half-width; "± n/a" with one episode).
- Efficiency is pooled: total target likes / total distinct targets found over the cell's episodes
  (a ratio of totals, so an episode that found nothing counts instead of silently dropping out),
  with the ratio estimator's interval (`ctrlsim.metrics.stats.ratio_ci`); "found k/n" says how many
  of the n episodes found any target.
- Tables are per black box: slates of 20 (NARM) and of 3 items are never pooled.
- The paired table compares each method with the reference method (default Base-Small) on the same
  (box, target, seed): the mean Coverage difference with its 95% t interval and the two-sided p of
  a Wilcoxon signed-rank test (scipy), and the minimum detectable effect: the difference a paired t
  test on these pairs would find 80% of the time at p < 0.05, given their spread
  (`ctrlsim.metrics.power`). With few pairs the test cannot reach significance (with 2 pairs the
  smallest two-sided p is 0.5): the table says what the run can resolve, nothing more.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from ctrlsim.backends.meter import unknown_tokens
from ctrlsim.experiments.tables import Table, Text
from ctrlsim.metrics.bounded import share_ci
from ctrlsim.metrics.stats import Estimate, format_estimate, mean_ci, paired_comparison, ratio_ci

SHARE_CURVES = ("coverage",)  # curves whose values are shares in [0, 1]: bootstrap intervals


def grouped(records: Mapping[str, dict], *fields) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records.values():
        groups[tuple(record[f] for f in fields)].append(record)
    return groups


def at(curve: list, t: int):
    """A per-round curve's value after round t (its last value for a shorter curve)."""
    return curve[min(t, len(curve)) - 1] if curve else None


def curve_estimate(recs: list[dict], metric: str, t: int) -> Estimate:
    values = [at(r["curves"][metric], t) for r in recs]
    return share_ci(values) if metric in SHARE_CURVES else mean_ci(values)


def coverage_cell(estimate: Estimate) -> str:
    """A Coverage share in %, with its (asymmetric) bootstrap bounds."""
    return format_estimate(estimate, 100, bounds=True)


def efficiency_estimate(recs: list[dict], t: int) -> Estimate:
    """Pooled Efficiency at round t over the episodes: Σ target likes / Σ distinct targets found."""
    counts = [r["efficiency_counts"] for r in recs]
    return ratio_ci([at(c["target_likes"], t) for c in counts], [at(c["found"], t) for c in counts])


def found_count(recs: list[dict], t: int) -> str:
    return f"{sum(1 for r in recs if at(r['efficiency_counts']['found'], t))}/{len(recs)}"


def method_labels(records: Mapping[str, dict]) -> dict[str, str]:
    """Method -> its label, as the records store it."""
    return {r["method"]: r.get("label", r["method"]) for r in records.values()}


def coverage_values(recs: list[dict], t: int, tag: str | None = None) -> list:
    """Per episode, the coverage at round t of the whole target, or (`tag`) of one tag of a union:
    the share of that tag's items found."""
    if tag is None:
        return [at(r["curves"]["coverage"], t) for r in recs]
    return [r["tag_found"][tag] / r["tag_sizes"][tag] for r in recs if r["tag_sizes"].get(tag)]


def _cells(config, records):
    """(box, method, label, episodes) for every cell that has records, in config order."""
    groups = grouped(records, "recommender", "method")
    for box in config.recommenders:
        for method in config.all_methods:
            recs = groups.get((box, method), [])
            if recs:
                yield box, method, recs[0].get("label", method), recs


def table1(config, records: Mapping[str, dict]) -> Table:
    """Table 1: Coverage (%) and pooled Exploration Efficiency at the report rounds, per box x method."""
    cps = config.report_rounds()
    header = ["Black-Box", "Method", "n"] + [f"Cov% t={t}" for t in cps] + [f"Eff t={t}" for t in cps]
    rows = [[box, label, len(recs)]
            + [coverage_cell(curve_estimate(recs, "coverage", t)) for t in cps]
            + [format_estimate(efficiency_estimate(recs, t)) for t in cps]
            for box, _, label, recs in _cells(config, records)]
    return Table.of("Table 1: Coverage (%) and Exploration Efficiency by round", rows, header)


def table7(config, records: Mapping[str, dict]) -> Table:
    """Table 7 per black box: Coverage, Efficiency, Len, Tokens at t = rounds, and the costs."""
    t = config.rounds
    header = ["Black-Box", "Method", "n", "K", "Cov.(%)", "Eff. (pooled)", "found", "Len.", "Tokens",
              "Setup tokens/probe", "Search likes (%)"]
    rows = []
    for box, _, label, recs in _cells(config, records):
        llm = recs[0]["policy"] == "llm"
        counted = sum(at(r["curves"]["len"], t) * r["k"] for r in recs)
        search = sum(r.get("search_likes", 0) for r in recs)
        rows.append([
            box, label, len(recs), round(sum(r["k"] for r in recs) / len(recs)),
            coverage_cell(curve_estimate(recs, "coverage", t)),
            format_estimate(efficiency_estimate(recs, t)), found_count(recs, t),
            format_estimate(curve_estimate(recs, "len", t)),
            tokens_cell(recs, t) if llm else "0 (no LLM)",
            setup_tokens_cell(recs),
            f"{100 * search / (search + counted):.1f}" if search + counted else "-",
        ])
    return Table.of(f"Table 7: all methods at t = {config.rounds}, per black box", rows, header)


def tokens_cell(recs: list[dict], t: int) -> str:
    """Tokens at round t; "unknown (u of n calls without counts)" when a server left counts out."""
    unknown = sum(r.get("tokens_unknown", {}).get("calls", 0) for r in recs)
    if unknown:  # the calls of all episodes are known only where every episode lacked some counts
        every = all("tokens_unknown" in r for r in recs)
        return unknown_tokens(unknown, sum(r["tokens_unknown"]["of"] for r in recs) if every else None)
    return format_estimate(curve_estimate(recs, "tokens", t), digits=0)


def setup_tokens_cell(recs: list[dict]) -> str:
    """Setup tokens per probe; unknown when some setup calls had no token counts (their number is a
    lower bound: a persona served from the profile store with unknown tokens counts as one call)."""
    unknown = sum(r.get("setup_tokens_unknown", 0) for r in recs)
    if unknown:
        return unknown_tokens(unknown, at_least=True)
    return format_estimate(mean_ci([r["setup_tokens"] / r["k"] for r in recs]), digits=0)


def _pairs(records: Mapping[str, dict], method: str, reference: str, box: str | None, t: int):
    """Matched Coverage values (method, reference) on the same (box, target, seed)."""
    by_unit = {(r["recommender"], r["target"], r["seed"], r["method"]): r for r in records.values()}
    mine, theirs = [], []
    for (b, target, seed, m), rec in sorted(by_unit.items(), key=lambda kv: str(kv[0])):
        if m != method or (box is not None and b != box):
            continue
        ref = by_unit.get((b, target, seed, reference))
        if ref is not None:
            mine.append(at(rec["curves"]["coverage"], t))
            theirs.append(at(ref["curves"]["coverage"], t))
    return mine, theirs


def paired_table(config, records: Mapping[str, dict]) -> Table:
    """Each method against the reference: Coverage difference (pp) with its 95% CI, Wilcoxon p."""
    t, reference = config.rounds, config.reference_method
    labels = method_labels(records)
    scopes = list(config.recommenders) + (["all boxes"] if len(config.recommenders) > 1 else [])
    header = ["Black-Box", "Method", f"vs {labels.get(reference, reference)}", "pairs",
              "ΔCov. (pp) ± 95% CI", "wins/ties/losses", "Wilcoxon p (two-sided)", "MDE (pp, 80% power)"]
    rows = []
    for scope in scopes:
        for method in config.all_methods:
            if method == reference:
                continue
            mine, theirs = _pairs(records, method, reference, None if scope == "all boxes" else scope, t)
            if not mine:
                continue
            cmp = paired_comparison(mine, theirs)
            ties = cmp.n - cmp.wins - cmp.losses
            p = "undefined (no non-zero difference)" if cmp.p_wilcoxon != cmp.p_wilcoxon \
                else f"{cmp.p_wilcoxon:.3g}"
            rows.append([scope, labels.get(method, method), labels.get(reference, reference), cmp.n,
                         format_estimate(cmp.difference, 100), f"{cmp.wins}/{ties}/{cmp.losses}", p,
                         mde_cell(cmp)])
    return Table.of(f"Paired comparison with {reference} (Coverage at t = {t})", rows, header)


def mde_cell(comparison) -> str:
    """The minimum detectable Coverage difference (pp) of a paired comparison."""
    return "n/a (one pair)" if comparison.n < 2 else f"{100 * comparison.mde:.2f}"


def substitution_table(config, records: Mapping[str, dict]) -> Table:
    """Per method, how often something stood in for what the method claims to be."""
    groups = grouped(records, "method")
    header = ["Method", "episodes", "template personas (%)", "merge fallbacks", "targets added by merge",
              "parse failures (%)", "dropped probes (%)", "searches refused"]
    rows = []
    for method in config.all_methods:
        recs = groups.get((method,), [])
        if not recs:
            continue
        probes = sum(r["k"] for r in recs)
        decisions = sum(r["decisions"] for r in recs)
        templates: list = [r.get("template_fallbacks") for r in recs]
        merges: list = [r.get("merges") for r in recs]
        refused = sum(p.get("searches_refused", 0) for r in recs for p in r["probes"])
        rows.append([
            recs[0].get("label", method), len(recs),
            f"{100 * sum(templates) / probes:.1f}" if None not in templates else "- (no LLM personas)",
            f"{sum(r['merge_fallbacks'] for r in recs)}/{sum(merges)}" if None not in merges else "-",
            sum(r["target_items_added"] for r in recs) if None not in merges else "-",
            f"{100 * sum(r['parse_failures'] for r in recs) / decisions:.1f}" if decisions else "-",
            f"{100 * sum(len(r['dropped']) for r in recs) / probes:.1f}",
            refused if decisions else "-",
        ])
    return Table.of("Substitutions and failures per method", rows, header)


def target_table(config, records: Mapping[str, dict], sizes: Mapping[str, int]) -> Table:
    """Coverage (%) per target and, for a union target, per tag (Figure 3), at t = rounds; mean ± 95%
    CI over boxes and seeds. A tag's coverage counts the found items carrying that tag."""
    t = config.rounds
    groups = grouped(records, "target", "method")
    labels = method_labels(records)
    header = ["Target", "Items"] + [labels.get(m, m) for m in config.all_methods]
    rows = []
    for target in config.targets:
        tags = target.split("+")
        for tag in [None] + (tags if len(tags) > 1 else []):
            rows.append([target if tag is None else f"  {tag}", sizes.get(tag or target, "-")]
                        + [coverage_cell(share_ci(coverage_values(groups.get((target, m), []), t, tag)))
                           for m in config.all_methods])
    return Table.of(f"Coverage (%) per target at t = {t} (Figure 3)", rows, header)


def profile_table(config, records: Mapping[str, dict]) -> Table | Text:
    """Table 2 per box x method: target similarity (Acc.) at t0 and t, old-interest similarity at t,
    JS divergence at t (eq. 2) and smoothness per interval; each mean ± 95% CI over episodes."""
    t = config.rounds
    cells = [c for c in _cells(config, records) if "profile_curves" in c[3][0]]
    title = f"Table 2: profile shaping at t = {t}"
    if not cells:
        return Text(f"## {title}\n\n(no episode recorded Task 2 curves: run with --task profile-shaping)")
    intervals = cells[0][3][0]["profile_curves"]["intervals"]
    header = ["Black-Box", "Method", "n", "Acc. t0", f"Acc. t{t}", f"Old-interest sim. t{t}",
              f"JS div. t{t} (eq. 2)"] + [f"Smooth. {i}" for i in intervals]
    rows = []
    for box, _, label, recs in cells:
        curves = [r["profile_curves"] for r in recs]
        rows.append([box, label, len(recs),
                     format_estimate(mean_ci([c["accuracy"][0] for c in curves]), digits=3),
                     format_estimate(mean_ci([c["accuracy"][-1] for c in curves]), digits=3),
                     format_estimate(mean_ci([c["old_interest"][-1] for c in curves]), digits=3),
                     format_estimate(mean_ci([c["js_divergence"][-1] for c in curves]), digits=3)]
                    + [format_estimate(mean_ci([c["smoothness"][n] for c in curves
                                                if n < len(c["smoothness"])]), digits=3)
                       for n in range(len(intervals))])
    return Table.of(title, rows, header)


def popularity_table(config, records: Mapping[str, dict]) -> Table:
    """Task 3 per box x method: eq. 3 over the items interacted with (liked on recommender slates),
    against the catalogue mean, and the new target discoveries in the first and second half."""
    half = max(1, config.rounds // 2)
    header = ["Black-Box", "Method", "n", "Interaction popularity (eq. 3)", "Catalogue mean",
              f"New targets t1-t{half}", f"New targets t{half + 1}-t{config.rounds}"]
    rows = []
    for box, _, label, recs in _cells(config, records):
        pops = [r["popularity_curves"] for r in recs]
        rows.append([box, label, len(recs),
                     format_estimate(mean_ci([p["interaction_popularity"] for p in pops]), digits=1),
                     f"{pops[0]['catalogue_popularity']:.1f}",
                     format_estimate(mean_ci([sum(p["new_discoveries"][:half]) for p in pops]), digits=1),
                     format_estimate(mean_ci([sum(p["new_discoveries"][half:]) for p in pops]), digits=1)])
    return Table.of("Task 3: popularity of what the probes interacted with (Figures 8, 9)", rows, header)
