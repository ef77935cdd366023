"""`ctrlsim probe`'s table (CtrlBench-Rec's Table 1 layout) and figure."""
from __future__ import annotations

import json

import numpy as np

from ctrlsim.experiments.probe.config import UNITS, ProbeRunConfig
from ctrlsim.experiments.tables import Table
from ctrlsim.experiments.usage import record_tokens


def format_tables(config: ProbeRunConfig, records: dict[str, dict]) -> list[Table]:
    """CtrlBench-Rec Table 1 layout: Coverage (%) and Exploration Efficiency at each checkpoint."""
    cps = config.resolved_checkpoints

    def fmt(v):
        return "-" if v is None else ("inf" if np.isinf(v) else f"{v:.2f}")

    header = ["Black-Box", "Method"] + [f"Cov% t={t}" for t in cps] + [f"Eff t={t}" for t in cps]
    rows = []
    episode, ceiling = records.get("episode"), records.get("ceiling")
    if episode:
        met = episode["metrics"]
        row = [config.recommender, f"Base (random, K={config.agents})"]
        row += [fmt(100 * met[str(t)]["coverage"]) if str(t) in met else "-" for t in cps]
        row += [fmt(met[str(t)]["efficiency"]) if str(t) in met else "-" for t in cps]
        rows.append(row)
    if ceiling and "at" in ceiling:
        rows.append([config.recommender, f"Ceiling ({ceiling['bound']})"]
                    + [fmt(100 * ceiling["at"][str(t)]) for t in cps] + ["" for _ in cps])
    title = f"Table 1 layout: {config.recommender}, target {config.target}, task {config.task}"
    lines = []
    if episode:
        lines += [f"- recommender: {json.dumps(episode['recommender'], default=str)}",
                  f"- task: {json.dumps(episode['task'], default=str)}",
                  f"- failed probes: {len(episode['failures'])} of {config.agents}",
                  f"- tokens (from the stored records): {record_tokens(episode).total} "
                  "(random probes use no LLM)"]
    missing = [u for u in UNITS if u not in records]
    if missing:
        lines.append(f"- not finished yet: {', '.join(missing)} (rerun the same command to resume)")
    return [Table.of(title, rows, header, after="\n".join(lines))]


def report(ctx, records) -> list[Table]:
    return format_tables(ctx.config, dict(records))


def figures(ctx, records) -> None:
    """Coverage and efficiency at each checkpoint (the episode), with the ceiling's coverage."""
    from ctrlsim.experiments.runfolder import new_figure

    episode, ceiling = records.get("episode"), records.get("ceiling")
    if not episode:
        return
    cps = [t for t in ctx.config.resolved_checkpoints if str(t) in episode["metrics"]]
    fig, (left, right) = new_figure((9, 3.5), 1, 2)
    left.plot(cps, [100 * episode["metrics"][str(t)]["coverage"] for t in cps], marker="o",
              label=f"Base (random, K={ctx.config.agents})")
    if ceiling and "at" in ceiling:
        left.plot(cps, [100 * ceiling["at"][str(t)] for t in cps], marker="s", linestyle="--",
                  label=f"ceiling ({ceiling['bound']})")
    left.set_xlabel("round t")
    left.set_ylabel("target coverage (%)")
    left.set_title(f"{ctx.config.recommender}, target {ctx.config.target}")
    left.legend()
    effs = [episode["metrics"][str(t)]["efficiency"] for t in cps]
    right.plot(cps, [e if np.isfinite(e) else np.nan for e in effs], marker="o")
    right.set_xlabel("round t")
    right.set_ylabel("exploration efficiency")
    right.set_title("Efficiency (lower is better)")
    ctx.folder.save_figure(fig, "coverage")
