"""`ctrlsim evolve`'s tables (as data) and figures, from the generation summaries and records."""
from __future__ import annotations

from ctrlsim.experiments.runner import RunContext
from ctrlsim.experiments.tables import Block, Table, Text
from ctrlsim.experiments.usage import record_tokens, total_tokens


def level_tables(levels: dict) -> list[Block]:
    first = next(iter(levels.values()))
    rows = [[name.capitalize(), *[_fmt(v) for v in rec["smoothness"]]] for name, rec in levels.items()]
    acc = [
        [
            name.capitalize(),
            _fmt(rec["accuracy"][0]),
            _fmt(rec["accuracy"][-1]),
            _fmt(rec["old_interest"][0]),
            _fmt(rec["old_interest"][-1]),
        ]
        for name, rec in levels.items()
    ]
    smooth = "Task 2: trajectory smoothness per interval (Table 2)"
    return [
        Table.of(smooth, rows, ["Level", *first["intervals"]], parse_numbers=True) if first["intervals"]
        else Text(f"## {smooth}\n\n(no interval: Table 2's first interval t0-t3 needs eval-rounds >= 3)"),
        Table.of("Task 2: similarity to the target and to the old interest (Figure 7), start and end", acc,
                 ["Level", "Acc. t0", "Acc. end", "Old t0", "Old end"], parse_numbers=True),
    ]


def save_level_figure(folder, levels: dict) -> None:
    from ctrlsim.experiments.runfolder import new_figure

    fig, axes = new_figure((4 * len(levels), 3.2), 1, len(levels), squeeze=False)
    for ax, (name, rec) in zip(axes[0], levels.items()):
        ax.plot(range(len(rec["accuracy"])), rec["accuracy"], label="target")
        ax.plot(range(len(rec["old_interest"])), rec["old_interest"], label="old interest", linestyle="--")
        ax.set_title(name.capitalize())
        ax.set_xlabel("round t")
        ax.set_ylabel("cosine similarity")
        ax.legend()
    folder.save_figure(fig, "task2_levels")


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _phase_tokens(phases: list[dict]):
    """The tokens of phases (their records); a lower bound marked unknown where calls had no counts."""
    from ctrlsim.backends.meter import unknown_tokens

    usage = total_tokens(phases)
    if not usage.unknown_calls:
        return usage.total
    return unknown_tokens(usage.unknown_calls, usage.calls, known=usage.total)


def render_tables(
    config, generations: list[dict], phases: dict, evaluation: dict | None
) -> list[Block]:
    from ctrlsim.backends.meter import unknown_tokens

    blocks: list[Block] = [Text(
        f"# Evolution\n\n{config.agents} probes, {config.merges} fusion(s) every {config.rounds_per_merge} "
        f"round(s), k rule {config.k_rule}, fusion {config.fusion}, target {', '.join(config.target)}, "
        f"LLM {config.llm}, black box {config.recommender}."
    )]
    rows = [
        [
            g["generation"],
            g["probes"],
            g["k"],
            _fmt(g["silhouette"]),
            max(g["sizes"]),
            sum(s == 1 for s in g["sizes"]),
            g["next_probes"],
            g["invalid_merges"],
        ]
        for g in generations
    ]
    header = ["gen", "probes", "k", "silhouette", "largest cluster", "singletons", "next probes", "fallbacks"]
    blocks.append(Table.of("Generations", rows, header, parse_numbers=True))
    rows = [
        [name, _fmt(e.get("seconds"), 1), _phase_tokens([e]), record_tokens(e).calls or 0]
        for name, e in phases.items()
    ]
    total = [
        [
            "total",
            _fmt(sum(e.get("seconds", 0) for e in phases.values()), 1),
            _phase_tokens(list(phases.values())),
            total_tokens(phases.values()).calls or 0,
        ]
    ]
    blocks.append(Table.of("Cost per phase (wall seconds of the run that finished the phase)", rows + total,
                           ["phase", "seconds", "tokens", "LLM calls"], parse_numbers=True))
    if evaluation:
        t_all = evaluation["rounds"]
        marks = sorted({t for t in (5, 10, 15, 20, t_all) if t <= t_all})
        curves = evaluation["curves"]
        usage = record_tokens(evaluation)  # a lower bound where some calls had no token counts
        rows = [
            [
                t,
                _fmt(100 * curves["coverage"][t - 1], 2) if curves["coverage"][t - 1] is not None else "-",
                _fmt(curves["efficiency"][t - 1], 2),
                _fmt(curves["len"][t - 1], 2),
                _fmt(curves["tokens"][t - 1], 0) if not usage.unknown_calls
                else unknown_tokens(usage.unknown_calls, usage.calls),
                evaluation["new_discoveries"][t - 1],
            ]
            for t in marks
        ]
        after = (f"Popularity of liked items (eq. 3): {_fmt(evaluation['interaction_popularity'], 1)} "
                 f"(catalogue mean {_fmt(evaluation['catalogue_popularity'], 1)})\n"
                 + probe_failures_line(evaluation.get("trace", {}).get("probes", [])))
        blocks.append(Table.of(
            f"Evaluation of the {evaluation['probes']} super probes ({evaluation['prompt_variant']} prompt)",
            rows, ["t", "Cov. %", "Eff.", "Len.", "Tokens", "new targets at t"], parse_numbers=True,
            after=after))
        blocks += validity_section(evaluation, config)
    return blocks


def validity_section(evaluation: dict, config) -> list[Block]:
    """The super probes' validity card (the same card `ctrlsim ctrlbench` prints per method)."""
    from ctrlsim.experiments import validity_card as VC

    if "validity" not in evaluation:
        return []
    record = {"method": "super probes", "label": "Super probes", "seed": config.seed,
              "target": "+".join(config.target), "validity": evaluation["validity"]}
    card = VC.card_for("super probes", [record])
    return [VC.validity_table({"super probes": card}, title="Probe validity of the super probes")]


def probe_failures_line(probes: list[dict]) -> str:
    """The probes' own failures in the evaluation: skipped rounds (unparseable replies), dropped probes."""
    decisions = sum(p.get("stats", {}).get("decisions", 0) for p in probes)
    failures = sum(p.get("stats", {}).get("parse_failures", 0) for p in probes)
    dropped = sum(1 for p in probes if p.get("dropped"))
    share = f"{100 * failures / decisions:.1f}%" if decisions else "-"
    return (f"Probe failures: {failures} of {decisions} decisions unparseable ({share}, skipped rounds); "
            f"{dropped} of {len(probes)} probes dropped\n")


def save_figures(folder, generations: list[dict], evaluation: dict | None) -> None:
    from ctrlsim.experiments.runfolder import new_figure

    fig, ax = new_figure((5, 3.2))
    sizes = [g["probes"] for g in generations] + ([generations[-1]["next_probes"]] if generations else [])
    ax.plot(range(len(sizes)), sizes, marker="o")
    ax.set_xlabel("generation")
    ax.set_ylabel("probes")
    ax.set_title("Population per generation")
    folder.save_figure(fig, "population")
    if not evaluation:
        return
    rounds = list(range(1, evaluation["rounds"] + 1))
    fig, (left, right) = new_figure((9, 3.2), 1, 2)
    left.plot(rounds, [100 * (c or 0) for c in evaluation["curves"]["coverage"]], marker=".")
    left.set_xlabel("round t")
    left.set_ylabel("coverage %")
    left.set_title("Coverage of the super probes")
    right.bar(rounds, evaluation["new_discoveries"])
    right.set_xlabel("round t")
    right.set_ylabel("new target items")
    right.set_title("New discoveries per round (Fig. 8)")
    folder.save_figure(fig, "evaluation")


# ----------------------------------------------------------------------------- driver hooks

def _phases(records) -> dict:
    return {k.removeprefix("phase/"): {f: v for f, v in r.items() if f != "phase"}
            for k, r in records.items() if k.startswith("phase/")}


def _generations(ctx: RunContext) -> list[dict]:
    result = ctx.state.get("result")
    if result is not None:
        return result.generations
    assert ctx.folder is not None
    return ctx.folder.read_json("generations.json", default=[])


def _levels(ctx: RunContext, records) -> dict:
    return {n: records[f"level/{n}"] for n in ctx.config.levels if f"level/{n}" in records}


def report(ctx: RunContext, records) -> list[Block]:
    tables = render_tables(ctx.config, _generations(ctx), _phases(records), records.get("evaluate"))
    levels = _levels(ctx, records)
    return tables + (level_tables(levels) if levels else [])


def figures(ctx: RunContext, records) -> None:
    levels = _levels(ctx, records)
    if levels:
        save_level_figure(ctx.folder, levels)
    save_figures(ctx.folder, _generations(ctx), records.get("evaluate"))


def summary(ctx: RunContext, records) -> dict:
    """What `ctrlsim.run("evolve", ...)` returns besides records and tables: the final super probes
    (Persona objects), the generations, the phases' ledger, the evaluation record, the LLM's identity,
    and `stopped_after` where the run was cut short (`resources={"stop_after": PHASE}`)."""
    loop = ctx.state.get("result")
    if loop is None:  # the loop failed or never ran: the records say what finished
        return {}
    if loop.stopped_after is not None:
        return {"stopped_after": loop.stopped_after, "phases": loop.phases}
    return {"final": loop.final, "generations": loop.generations, "phases": loop.phases,
            "evaluation": records.get("evaluate"), "llm": ctx.state["llm"].identity, "stopped_after": None}
