"""SteerEval's tables 1-8 and figures, computed from stored records (no model is loaded)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np

from ctrlsim.experiments.config import config_from_dict, config_to_dict
from ctrlsim.experiments.runner import RunContext
from ctrlsim.experiments.scores import Scores
from ctrlsim.experiments.steereval.config import RECORD_FIELDS, SteerEvalConfig
from ctrlsim.experiments.steereval.units import CONDITIONS, LLM_WRITTEN, plan
from ctrlsim.experiments.tables import Block, Table, Text, blocks_from_json, render_markdown, tables_json
from ctrlsim.experiments.usage import total_tokens
from ctrlsim.metrics.stats import format_test, mean_ci
from ctrlsim.metrics.steereval import direction_cell, rejected_tags
from ctrlsim.seeding import derive_rng

# The paper's numbers (Llama-3.1-8B, ML-25M + TMDb, 94 tags x 10 users), shown beside ours.
PAPER: dict[str, dict[Any, tuple[float, float]]] = {
    "Table 1": {"LLM scoring": (0.0476, -0.0266), "Embedding": (0.0636, 0.0473)},
    "Table 2": {"Paragraph-length": (0.0476, -0.0266), "Sentence-length": (0.0647, -0.0231)},
    "Table 3": {"Template append": (0.0476, -0.0266), "LLM append": (0.0417, -0.0198),
                "LLM rewrite": (0.0589, -0.0379)},
    "Table 4": {"Stronger": (0.0569, -0.0330), "Weaker": (0.0471, -0.0224)},
    "Table 5": {"Genre": (0.1095, -0.0654), "Trigger (kept)": (0.0320, -0.0168),
                "Trigger (all)": (0.0297, -0.0169)},
    "Table 7": {"Genre-Oracle": (0.1660, -0.1504), "Genre": (0.1095, -0.0654),
                "Trigger-Oracle": (0.1211, -0.1721), "Trigger": (0.0320, -0.0168),
                "All-Oracle": (0.1302, -0.1677), "All": (0.0476, -0.0266)},
    "Table 8": {("increase", True): (21.09, 3.38), ("increase", False): (19.37, -0.98),
                ("decrease", True): (20.47, -0.58), ("decrease", False): (19.15, 0.05)},
}



def token_totals(records: list[dict]) -> dict[str, int | None]:
    """Tokens spent, summed from the stored records (so a resumed run reports the whole run);
    `unknown_calls` (only when non-zero) counts calls whose server sent no token counts."""
    usage = total_tokens(records)
    return {"prompt_tokens": usage.prompt, "completion_tokens": usage.completion, "total_tokens": usage.total,
            **({"unknown_calls": usage.unknown_calls} if usage.unknown_calls else {})}


def tokens_text(tokens: dict) -> str:
    """`token_totals` as the report prints it: a lower bound marked unknown where counts are missing."""
    from ctrlsim.backends.meter import unknown_tokens

    if tokens.get("unknown_calls"):
        return unknown_tokens(tokens["unknown_calls"], known=tokens["total_tokens"])
    return str(tokens)


# ----------------------------------------------------------------------------- tables

def _by(records, **match) -> list[dict]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def _cell(records: list[dict], direction: str) -> str:
    cell = direction_cell(records, direction)
    return "-" if cell is None else f"{format_test(cell.test)} n={cell.n}"


def _paper(table: str, row: str, direction: str) -> str:
    label = re.sub(r" \(\d+\)$", "", row)  # "Genre (19)" -> "Genre"
    values = PAPER.get(table, {}).get(label)
    return "" if values is None else f"{values[0 if direction == 'increase' else 1]:+.4f}"


def _table(title: str, rows: list[tuple[str, list[dict]]], paper_key: str | None = None) -> Table:
    body = [[name, _cell(rs, "increase"), _paper(paper_key or "", name, "increase"),
             _cell(rs, "decrease"), _paper(paper_key or "", name, "decrease")] for name, rs in rows]
    head = ["", "Incr. ΔAUC_t (↑)", "paper", "Decr. ΔAUC_t (↓)", "paper"]
    return Table.of(title, body, head, level=0, after=_mde_note([rs for _, rs in rows]))


def _mde_note(cells: list[list[dict]]) -> str:
    """The range of the cells' minimum detectable ΔAUC_t (one-tailed, 80% power, p < 0.05)."""
    mdes = [c.test.mde for rs in cells for d in ("increase", "decrease")
            if (c := direction_cell(rs, d)) is not None and c.test.mde == c.test.mde]
    if not mdes:
        return ""
    span = f"{min(mdes):.4f}" if min(mdes) == max(mdes) else f"{min(mdes):.4f} to {max(mdes):.4f}"
    return (f"Minimum detectable ΔAUC_t per cell (the true change its one-tailed paired t test would find "
            f"80% of the time at p < 0.05, given the cell's spread): {span} (docs/statistics.md).")


def kept_trigger_tags(records: list[dict], max_share: float) -> tuple[set[str], set[str]] | None:
    """(kept, rejected) trigger tags by the refusal filter, or None when no LLM-written edit ran."""
    written = [r for r in records if r["condition"] in LLM_WRITTEN and r["tag_kind"] == "trigger"]
    triggers = {r["tag"] for r in records if r["tag_kind"] == "trigger"}
    if not triggers or not written:
        return None
    rejected = rejected_tags(written, max_share)
    return triggers - rejected, rejected & triggers


def per_tag_summary(records: list[dict], alpha: float = 0.05) -> dict[str, dict]:
    """Per direction: tag -> (mean ΔAUC_t, steered the right way, significant) over `records`."""
    out: dict[str, dict] = {}
    for direction in ("increase", "decrease"):
        out[direction] = {}
        for tag in sorted({r["tag"] for r in records}):
            cell = direction_cell(_by(records, tag=tag), direction)
            if cell is not None:
                out[direction][tag] = (cell.mean, cell.steered, cell.test.significant(alpha))
    return out


def _tag_list(summary: dict, tags: list[str]) -> str:
    return ", ".join(f"{t} ({summary[t][0]:+.4f})" for t in tags) or "-"


def table6(default: list[dict]) -> list[Block]:
    parts: list[Block] = [
        Text("Table 6. Mean ΔAUC_t per tag (default condition): most and least steered tags")]
    for kind in sorted({r["tag_kind"] for r in default}):
        summary = per_tag_summary(_by(default, tag_kind=kind))
        rows = []
        for direction, sign in (("increase", 1), ("decrease", -1)):
            tags = summary[direction]
            right = sorted((t for t, v in tags.items() if v[1]), key=lambda t: -sign * tags[t][0])
            rows += [[f"Biggest {direction}", _tag_list(tags, right[:3])],
                     [f"Smallest {direction}", _tag_list(tags, right[::-1][:3])]]
            n_right = sum(v[1] for v in tags.values())
            n_sig = sum(v[1] and v[2] for v in tags.values())
            rows.append([f"Tags steered ({direction})",
                         f"{n_right}/{len(tags)} in the right direction, {n_sig}/{len(tags)} significantly "
                         f"(paper, all tags: {'89/94' if direction == 'increase' else '76/94'} "
                         "right direction)"])
        parts.append(Table.of(f"{kind.capitalize()} tags", rows, ["", "tags (ΔAUC_t)"], level=0))
    return parts


def table8(default: list[dict], samples: int, seed: int) -> Table:
    rows = []
    for direction in ("increase", "decrease"):
        for rel, name in ((True, "Rel."), (False, "Irrel.")):
            cell = [r for r in _by(default, direction=direction) if r["next_item_relevant"] == rel]
            if not cell:
                continue
            rng = derive_rng(seed, "steereval-table8", direction, name)
            chosen = [cell[i] for i in sorted(rng.choice(len(cell), min(samples, len(cell)), replace=False))]
            before = np.mean([r["rank_set_before"] for r in chosen])
            delta = np.mean([r["rank_set_after"] - r["rank_set_before"] for r in chosen])
            paper = PAPER["Table 8"][(direction, rel)]
            rows.append([direction.capitalize(), name, f"{before:.2f}", f"{delta:+.2f}", len(chosen),
                         f"{paper[0]:.2f}", f"{paper[1]:+.2f}"])
    title = ("Table 8. Rank_set of the true next item within its relevance subset (lower is better; the "
             "paper's subsets have 50 items, ours pool_size/2)")
    header = ["Task", "Type", "Original Rank_set", "ΔRank_set", "n", "paper orig.", "paper Δ"]
    return Table.of(title, rows, header, level=0)


def format_tables(result: dict, config: SteerEvalConfig) -> list[Block]:
    recs = result["records"]
    default = _by(recs, condition="default")
    rating = "digit probabilities" if config.rating == "digits" else "generate-and-parse"
    llm = result["llm"]
    if isinstance(llm, dict):
        llm = f"{llm.get('model')} ({llm.get('runtime')}, sha256 {str(llm.get('sha256', ''))[:12]})"
    head = (f"# SteerEval tables\n\nLLM: {llm}; rating: {rating}; encoder: {config.encoder}; "
            f"dataset: {config.dataset}; pool: {config.pool_size}; users per tag: {config.users}; "
            f"tags: {len({r['tag'] for r in recs})}; records: {len(recs)}\n\n"
            "ΔAUC_t cells: mean over scenarios, (*) one-tailed paired t-test significant at 0.05, "
            "'undefined' when every difference is identical; 'paper' = the published value.\n")
    parts: list[Block] = [Text(head),
             _table(f"Table 1. Ranking method (paragraph profile, template append; LLM rating: {rating})",
                    [("LLM scoring", default), ("Embedding", _by(recs, condition="embedding"))], "Table 1"),
             _table("Table 2. Profile generation (LLM scoring, template append)",
                    [("Paragraph-length", default), ("Sentence-length", _by(recs, condition="sentence"))],
                    "Table 2"),
             _table("Table 3. Steering intervention",
                    [("Template append", default), ("LLM append", _by(recs, condition="llm-append")),
                     ("LLM rewrite", _by(recs, condition="llm-rewrite"))], "Table 3"),
             _table("Table 4. Emphasis level", [("Stronger", _by(recs, condition="stronger")),
                                                ("Weaker", _by(recs, condition="weaker"))], "Table 4")]
    kinds = sorted({r["tag_kind"] for r in default})
    rows5: list[tuple[str, list[dict]]] = []
    filtered = kept_trigger_tags(recs, config.max_refusal_share)
    for kind in kinds:
        of_kind = _by(default, tag_kind=kind)
        if kind == "trigger" and filtered is not None:
            kept = [r for r in of_kind if r["tag"] in filtered[0]]
            rows5.append((f"Trigger (kept) ({len(filtered[0])})", kept))
            rows5.append((f"Trigger (all) ({len({r['tag'] for r in of_kind})})", of_kind))
        else:
            rows5.append((f"{kind.capitalize()} ({len({r['tag'] for r in of_kind})})", of_kind))
    table5 = _table("Table 5. Tag source", rows5, "Table 5")
    if filtered is not None:
        table5 = dataclasses.replace(
            table5, after=f"Trigger filter dropped: {', '.join(sorted(filtered[1])) or 'none'}")
    parts += [table5, *table6(default)]
    rows7 = []
    for kind in kinds:
        rows7 += [(f"{kind.capitalize()}-Oracle", _by(recs, condition="oracle", tag_kind=kind)),
                  (kind.capitalize(), _by(default, tag_kind=kind))]
    rows7 += [("All-Oracle", _by(recs, condition="oracle")), ("All", default)]
    parts.append(_table("Table 7. Oracle item information", rows7, "Table 7"))
    if _by(recs, condition="tags-visible"):
        parts.append(_table("Tag leak check (not in the paper): item texts listing their tags",
                            [("Tag-free (default)", default),
                             ("Tags visible", _by(recs, condition="tags-visible"))]))
    parts.append(table8(default, config.table8_samples, config.seed))
    problems = sum(1 for r in recs if r.get("edit_problems"))
    parts.append(Text(f"Scenarios with edit problems (refusal/misreading flags): {problems} of {len(recs)}; "
                      f"tags short of users: {result['short_tags'] or 'none'}; "
                      f"tokens: {tokens_text(result['tokens'])}"))
    return parts


# ----------------------------------------------------------------------------- figures

def write_figures(folder, records: list[dict]) -> None:
    """ΔAUC_t per condition and per tag (default condition), with 95% confidence intervals."""
    from ctrlsim.experiments.runfolder import new_figure

    if not records:
        return
    for name, groups in (("delta_auc_per_condition", "condition"), ("delta_auc_per_tag", "tag")):
        rows = records if groups == "condition" else _by(records, condition="default")
        labels = sorted({r[groups] for r in rows}, key=lambda v: (list(CONDITIONS).index(v)
                                                                  if groups == "condition" else 0, v))
        if not labels:
            continue
        fig, ax = new_figure((max(6.0, 0.5 * len(labels) + 2), 4))
        width = 0.4
        for shift, direction in ((-width / 2, "increase"), (width / 2, "decrease")):
            stats = [mean_ci([r["delta_auc"] for r in _by(rows, **{groups: g}, direction=direction)])
                     for g in labels]
            means = [s.value for s in stats]
            errors = [s.half_width if s.n >= 2 else 0.0 for s in stats]  # no bar from one value
            ax.bar(np.arange(len(labels)) + shift, means, width, yerr=errors, capsize=3, label=direction)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(labels)), labels, rotation=45, ha="right")
        ax.set_ylabel("mean ΔAUC_t (95% CI)")
        ax.set_title(f"SteerEval ΔAUC_t per {groups}")
        ax.legend()
        folder.save_figure(fig, name)


# ----------------------------------------------------------------------------- score rows

def score_rows(config: SteerEvalConfig, records):
    """Each episode's signed Delta-AUC_t (its reward) as a score row (`ctrlsim.experiments.scores`):
    the method is its condition, the box the condition's ranker (`llm` or `embedding`, as calibrate
    names SteerEval's boxes), the observation its scenario under the run's seed."""
    for key, record in records.items():
        yield {"key": key, "method": record["condition"], "box": CONDITIONS[record["condition"]].ranker,
               "observation": f"seed={config.seed}/{record['user']}/{record['tag']}/{record['direction']}",
               "seed": config.seed, "metric": "delta_auc", "value": float(record["reward"]), "share": False}


# The LLM both writes the edits and scores the items (the box's own model), so there is no separate
# probe model for a sensitivity analysis to vary.
def reference_condition(config: SteerEvalConfig) -> str:
    """The condition every other one is compared with: `default` where it ran."""
    return "default" if "default" in config.conditions else config.conditions[0]


SCORES = Scores(rows=score_rows, headline=lambda config: "delta_auc", probe_llm_field=None,
                reference=reference_condition)


# ----------------------------------------------------------------------------- driver hooks

def run_result(ctx: RunContext, records) -> dict[str, Any]:
    """The run's result (`ctrlsim.run("steereval", ...).summary`): config, open choices, the LLM's
    identity, tags short of users, every record, token totals summed from the records."""
    rows = list(records.values())
    return {"config": config_to_dict(ctx.config), "choices": ctx.state.get("choices", {}),
            "short_tags": ctx.state.get("short", {}), "llm": rows[0]["llm"] if rows else ctx.config.llm,
            "records": rows, "tokens": token_totals(rows)}


def report(ctx: RunContext, records) -> list[Block]:
    """The tables. Those of a finished run are made once per (result, config, code) and read back by
    a rerun with the same records (as tables.json's data); the partial tables written while units
    run are not kept."""
    import json

    from ctrlsim.experiments.output_cache import cached_text

    result = run_result(ctx, records)
    if not set(plan(ctx, records)) <= set(records):
        return format_tables(result, ctx.config)
    text = cached_text("steereval-report", {"result": result, "config": config_to_dict(ctx.config)},
                       lambda: json.dumps(tables_json(format_tables(result, ctx.config))))
    return blocks_from_json(json.loads(text))


def figures(ctx: RunContext, records) -> None:
    """The figures; drawn once per (records, code): a rerun with the same records reads them back."""
    from ctrlsim.experiments.output_cache import cached_figures

    rows = list(records.values())
    cached_figures(ctx.folder, "steereval-figures", rows, lambda target: write_figures(target, rows))


def tables_from_folder(out: str | Path) -> str:
    """The tables of a run folder's records so far (read-only: works while a run is still writing)."""
    from ctrlsim.experiments.store import read_run_records

    stored, records = read_run_records(Path(out) / "records.jsonl", RECORD_FIELDS)
    names = {f.name for f in dataclasses.fields(SteerEvalConfig) if f.init}
    config = config_from_dict(SteerEvalConfig, {k: v for k, v in stored.items() if k in names})
    rows = list(records.values())
    result = {"records": rows, "llm": rows[0]["llm"] if rows else config.llm, "short_tags": {},
              "tokens": token_totals(rows)}
    return render_markdown(format_tables(result, config))
