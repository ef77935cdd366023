"""The audit's "Does control last?" section: the persistence sub-run's numbers, in plain words.

The numbers are the ctrlbench runner's own (`RunResult.summary` of a `--task persistence` run,
`ctrlbench.persistence.run_summary`): per box and probe method, s0 and s*, the retention band, the
Kaplan-Meier half-life, relapse and area, and the log-rank between boxes. This module adds what the
audit says about them: what each box remembers (docs/calibration.md), one sentence per box and
method that reads the numbers without a verdict, the headline entries and the caveats. Pure
functions of the sub-run's result and the summary (no I/O).
"""
from __future__ import annotations

from typing import Any, Mapping

from ctrlsim.experiments.audit.words import FAILED_CARD, LABELS, _ci, card_passes

SUBRUN = "persistence"
EMBEDDING_BOXES = ("embedding", "bge", "twhin-bert")  # they average the whole liked history
SEQUENTIAL_BOXES = ("narm", "sasrec")  # RecBole models, as any recbole:<Model>


def sequential_window() -> int:
    """The liked items a RecBole box reads (`SequentialConfig.max_seq_length`, RecBole's
    MAX_ITEM_LIST_LENGTH as ctrlsim trains it)."""
    from ctrlsim.recommenders.recbole.config import SequentialConfig

    return int(SequentialConfig().max_seq_length)


def box_memory(box: str) -> dict:
    """What a box remembers of the likes it was given, as far as its design says (docs/calibration.md):
    {"text", "window"}, window = the number of latest likes it reads where that bounds its memory."""
    from ctrlsim.recommenders.dial import is_dial, parse_dial_spec

    if box in EMBEDDING_BOXES:
        return {"window": None, "text": f"{box} scores items against the mean embedding of the whole liked "
                "history: each old like weighs less with every new one but never drops out, so it never "
                "fully forgets a steering"}
    if box in SEQUENTIAL_BOXES or box.startswith("recbole:"):
        w = sequential_window()
        return {"window": w, "text": f"{box} reads only the last {w} liked items, the starting history "
                f"included: once {w} newer likes have pushed the steering likes out, they can no longer "
                "move its slates"}
    if box == "popularity":
        return {"window": 0, "text": "popularity ignores the user (it only leaves out what was already "
                "seen): it has no memory of likes, so any gain and its fading are drift of the slates"}
    if is_dial(box):
        spec = parse_dial_spec(box)
        if spec.lam == 0:
            return {"window": 0, "text": f"{box} ignores the user (lambda = 0): nothing to remember"}
        what = "every liked item, the starting history included" if spec.options.get("follow") == "history" \
            else "the liked items it showed itself"
        if "window" in spec.options:
            w = int(spec.options["window"])
            return {"window": w, "text": f"{box} follows only the last {w} of {what}: at lambda = 1 a "
                    f"steering is gone after {w} newer followed likes (the dial's known answer)"}
        return {"window": None, "text": f"{box} follows {what}, every one of them forever (no window), on "
                f"a share {spec.lam:g} of its slate positions: it never forgets"}
    return {"window": None, "text": f"{box}: what it remembers is not known to ctrlsim; the run measures "
            "what its slates did, not why"}


def persistence_section(result) -> dict:
    """The sub-run's numbers (its `RunResult.summary`), with each box's memory, the probes' tokens, the
    plain reading and the log-rank sentences."""
    from ctrlsim.experiments.usage import total_tokens

    section = dict(result.summary)
    section["memory"] = {box: box_memory(box) for box in section["boxes"]}
    section["tokens"] = total_tokens(result.records_by_key.values()).total
    section["reading"] = reading_lines(section)
    section["log_rank_reading"] = [log_rank_words(section, row) for row in section["log_rank"]]
    section["limits"] = list(LIMITS)
    section["half_life_text"] = {box: {method: km_text(cell["half_life"]) for method, cell in per.items()}
                                 for box, per in section["cells"].items()}
    return section


def _pct(e: Mapping[str, Any]) -> str:
    """A share's estimate in percent, with its interval."""
    return _ci({k: (None if e.get(k) is None else 100 * e[k]) for k in ("value", "low", "high")}, 1, "%")


def _upper(h: Mapping[str, Any], open_text: str, censored_text: str) -> str:
    """The half-life's upper bound: a number, censored (the band's upper curve never reached 1/2 while
    episodes were still at risk), or open (every episode fell to half, where the band is undefined)."""
    if h["high"] is not None:
        return f"{h['high']:g}"
    return open_text if h["events"] == h["n"] else censored_text


def km_text(h: Mapping[str, Any]) -> str:
    """The half-life's table cell: "2 [1, 4] (5/6)"; "not reached" for a censored median, "censored"
    for an upper bound beyond the release, "open" for one the band leaves undefined, "-" without
    steered episodes."""
    if not h["n"]:
        return "-"
    median = "not reached" if h["median"] is None else f"{h['median']:g}"
    low = "n/a" if h["low"] is None else f"{h['low']:g}"
    return f"{median} [{low}, {_upper(h, 'open', 'censored')}] ({h['events']}/{h['n']})"


def half_life_words(h: Mapping[str, Any], release: int) -> str:
    """The Kaplan-Meier half-life in words: the median with its interval, or that it was not reached."""
    if not h["n"]:
        return "no steered episode"
    if h["median"] is None:
        return (f"not reached within the {release} release rounds: {h['events']} of {h['n']} steered "
                "episode(s) fell to half the gain (the median is censored)")
    high = _upper(h, "an upper bound this many episodes leave open", "no upper bound (censored)")
    low = "n/a" if h["low"] is None else f"{h['low']:g}"
    return (f"a median of {h['median']:g} release round(s) (95% CI {low} to {high}; {h['events']} of "
            f"{h['n']} steered episodes fell to half)")


def cell_words(ps: Mapping[str, Any], box: str, method: str) -> str:
    """One sentence per box and method: what the numbers say, no verdict."""
    cell, phases = ps["cells"][box][method], ps["phases"]
    who, target = LABELS.get(method, cell["label"]), " + ".join(ps["targets"])
    if not cell["measured"]:
        return f"{box}, {who}: no episode had a recommender slate in every round, so nothing was measured"
    text = (f"{box}, {who}: the share of {target} items on its slates was {_pct(cell['s0'])} before steering "
            f"(s0) and {_pct(cell['s_star'])} at the end of {phases['steer']} steering rounds (s*)")
    bar = f"{100 * ps['min_gain']:g} points"
    if not cell["steered"]:
        return (text + f"; in none of the {cell['episodes']} episodes did steering raise it by more than "
                f"{bar}, so there was no gain whose lasting could be measured")
    last = min(ps["last_k"], phases["release"])
    return (text + f"; steering raised it by more than {bar} in {cell['steered']} of {cell['episodes']} "
            f"episodes. In those, once the probes went back to their goal-free likes, half the gain was "
            f"gone after {half_life_words(cell['half_life'], phases['release'])}; relapse (the share of the "
            f"gain lost by the last {last} release rounds) {_ci(cell['relapse'])}; retention area (the mean "
            f"share of the gain kept over the {phases['release']} release rounds) {_ci(cell['area'])}; the "
            f"probes gave {_ci(cell['release_likes'], 1)} likes each in release")


def reading_lines(ps: Mapping[str, Any]) -> list[str]:
    return [cell_words(ps, box, method) + "." for box in ps["boxes"] for method in ps["methods"]
            if method in ps["cells"].get(box, {})]


def log_rank_words(ps: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    """The log-rank test of two boxes' half-lives, for one method, in words."""
    a, b, who = row["box_a"], row["box_b"], LABELS.get(row["method"], row["method"])
    counts = (f"{row['n_a']} and {row['n_b']} steered episodes ({row['events_a']} and {row['events_b']} fell "
              "to half)")
    if row["p"] is None:
        return f"{a} vs {b}, {who}: the log-rank test is undefined over {counts}."
    return (f"{a} vs {b}, {who}: log-rank z = {row['z']:+.2f}, two-sided p = {row['p']:.3g}, over "
            f"{counts}; z > 0 means the gain faded sooner on {a} than equal half-lives would give. A p above "
            "0.05 is no evidence that the two boxes forget alike.")


def _short(ps: Mapping[str, Any], box: str, method: str) -> str:
    cell = ps["cells"][box][method]
    who = LABELS.get(method, cell["label"])
    if not cell["steered"]:
        return f"{who} raised the share by more than {100 * ps['min_gain']:g} points in none of " \
               f"{cell['episodes']} episodes"
    h = cell["half_life"]
    if h["median"] is None:
        half = (f"half-life not reached in {ps['phases']['release']} rounds ({h['events']}/{h['n']} fell "
                "to half)")
    else:
        low = "n/a" if h["low"] is None else f"{h['low']:g}"
        half = (f"half-life {h['median']:g} rounds [{low}, {_upper(h, 'open', 'censored')}] ({h['events']}/"
                f"{h['n']} fell to half)")
    return f"{who}: {half}, relapse {_ci(cell['relapse'])}"


def persistence_headline(summary: Mapping[str, Any]) -> list[dict]:
    """One headline entry per box and method (probes that passed their validity card first): the
    Kaplan-Meier half-life as its estimate, a short text, and the lead of the box's line."""
    ps = (summary["subruns"].get(SUBRUN) or {}).get("numbers")
    if not ps:
        return []
    out = []
    phases, target = ps["phases"], " + ".join(ps["targets"])
    methods = sorted(ps["methods"], key=lambda m: card_passes(ps, m) is False)
    for box in ps["boxes"]:
        for method in methods:
            cell = ps["cells"].get(box, {}).get(method)
            if cell is None:
                continue
            h, valid = cell["half_life"], card_passes(ps, method)
            text = _short(ps, box, method) + (FAILED_CARD if valid is False else "")
            out.append({"protocol": SUBRUN, "box": box, "method": method, "metric": "half_life",
                        "estimate": {"value": h["median"], "low": h["low"], "high": h["high"], "n": h["n"]},
                        "valid": valid, "text": text,
                        "lead": f"Does control last on {box}? After {phases['steer']} rounds of steering "
                                f"toward {target} and {phases['release']} of release: "})
    return out


def persistence_caveats(summary: Mapping[str, Any]) -> list[str]:
    """What limits the section's numbers: drift the coin-flip probe shows, and a release shorter than
    a box's window."""
    ps = (summary["subruns"].get(SUBRUN) or {}).get("numbers")
    if not ps:
        return []
    out = []
    bar = f"{100 * ps['min_gain']:g} points"
    for box in ps["boxes"]:
        cells = ps["cells"].get(box, {})
        floor = cells.get("random")
        if floor and floor["steered"]:
            out.append(f"Does control last, {box}: the coin-flip probe, which pursues no goal, raised the "
                       f"target share by more than {bar} in {floor['steered']} of {floor['episodes']} "
                       "episodes: the box's slates move that much on their own, so a gain of that size is no "
                       "evidence of steering, and its fading no evidence of forgetting.")
        window = ps["memory"][box]["window"]
        for method, cell in cells.items():
            likes = cell["release_likes"]["value"]
            if not window or not cell["steered"] or likes is None:
                continue
            who = LABELS.get(method, cell["label"])
            head = f"Does control last, {box}: {who} gave {likes:.1f} likes each in release"
            if likes < window:
                out.append(f"{head}, fewer than the {window} liked items {box} reads: the steering likes "
                           "were still inside its window when the run ended, so a gain kept to the end says "
                           "the window had not turned over, not that the box remembers for good (`--config` "
                           '{"persistence": {"release_rounds": ...}} runs a longer release).')
            else:
                out.append(f"{head}, at least the {window} liked items {box} reads: by the end the steering "
                           "likes had left its window, so a gain still kept then is not memory of them.")
    return out


# What a persistence sub-run cannot show whatever its numbers (the report's list; docs/audit.md).
LIMITS = (
    "A box the probes did not steer ('steered' 0) says nothing about its memory: retention is defined "
    "only where steering moved the target share by more than the bar.",
    "Retention divides by the gain s* - s0: with slates of a few items one item more or less moves a probe's "
    "share by a third, so a gain near the bar makes R(tau) swing far above 1 or below 0.",
    "A half-life censored at R rounds means it did not halve within the R release rounds observed, not that "
    "the box never forgets; and it is counted in release rounds, not likes.",
    "The release is the probes' own goal-free likes: what a box forgets is what those likes push out. A "
    "user who stops using the box is another experiment (`--release skip`).",
    "One target and one set of phase lengths: other tags, longer steering or a longer release can last "
    "differently, and the small bundled LLM probes steer far less than a strong model would.",
)

