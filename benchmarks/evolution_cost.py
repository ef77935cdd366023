"""Wall time and tokens per phase of the evolution loop, and the paper-size run extrapolated.

Runs a small `ctrlsim evolve` (default 8 -> 4 -> 2 probes, E_i = 2, t = 2 evaluation rounds)
with a fresh run folder and response cache, prints each phase's wall time, LLM calls and
tokens, then scales each phase by the number of LLM calls the paper-size run makes
(K_init = 100 -> 50 -> 25, E_i = 2, E_m = 2, t = 20) at the measured seconds and tokens per
call. The goal this checks: the paper-size run on a 2-core CPU with qwen2.5-0.5b in under
30 minutes. Prompts hold one persona, or one cluster of about two members under the halving
rule, so the extrapolation is linear in calls; it keeps the small run's batch sizes, and larger
batches decode each token more cheaply (one thread: 42, 28 and 21 ms per generated token for 1,
4 and 16 sequences), so it overstates the paper-size run somewhat. Seconds per call come from
CPU time with one llama.cpp thread and from wall time with more (`--basis`; take those on an
idle machine). The machine load (`os.getloadavg`) is printed because other work on a shared
box slows every call.

    python benchmarks/evolution_cost.py --agents 8 --llm qwen2.5-0.5b
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

GOAL_SECONDS = 30 * 60


def paper_calls(
    kind: str,
    generation: int,
    *,
    k_init: int,
    merges: int,
    e_i: int,
    t: int,
    debating_share: float,
    retry_share: float,
) -> float:
    """LLM calls of one phase in the paper-size run (halving: N_g = ceil(K / 2^g))."""
    sizes = [k_init]
    for _ in range(merges):
        sizes.append(-(-sizes[-1] // 2))
    n = sizes[generation] if generation < len(sizes) else sizes[-1]
    if kind == "profiles":
        return k_init * (1 + retry_share)
    if kind == "interact":
        return n * e_i
    if kind == "debate":
        return 2 * n * debating_share
    if kind == "merge":
        return sizes[generation + 1] * (1 + retry_share)
    if kind == "evaluate":
        return sizes[-1] * t
    return 0.0


def measure(args) -> tuple[dict, dict]:
    import ctrlsim
    from ctrlsim.experiments.config import RunOptions
    from ctrlsim.experiments.evolve.config import EvolveConfig

    config = EvolveConfig(
        agents=args.agents,
        merges=args.merges,
        rounds_per_merge=args.rounds_per_merge,
        eval_rounds=args.eval_rounds,
        llm=args.llm,
        recommender=args.recommender,
        seed=args.seed,
        conversation=args.conversation,
        eval_conversation=args.conversation,
    )
    out = Path(args.out or tempfile.mkdtemp(prefix="evolution-cost-"))
    options = RunOptions(out=str(out), overwrite=not args.resume, allow_code_change=args.resume)
    result = ctrlsim.run("evolve", config=config, options=options, show_progress=True).summary
    phases = dict(result["phases"])
    evaluation = result["evaluation"]
    if evaluation:
        phases["evaluate"] = {
            k: evaluation[k] for k in ("seconds", "cpu_seconds", "tokens") if k in evaluation
        }
    clusters = [json.loads((out / f"clusters_g{g}.json").read_text()) for g in range(args.merges)]
    debating = sum(len(m) for c in clusters for m in c["members"] if len(m) >= 2)
    total = sum(len(c["probe_ids"]) for c in clusters)
    shares = {"debating_share": debating / total if total else 1.0}
    merges = [json.loads((out / f"merge_g{g}.json").read_text())["outcomes"] for g in range(args.merges)]
    outcomes = [o for m in merges for o in m]
    shares["retry_share"] = sum(o["retried"] for o in outcomes) / len(outcomes) if outcomes else 0.0
    return phases, shares


def report(phases: dict, shares: dict, args) -> str:
    from tabulate import tabulate

    rows, projected = [], {}
    for name, entry in phases.items():
        tokens = entry.get("tokens", {})
        calls = tokens.get("calls", 0) - tokens.get("cached_calls", 0)
        seconds = entry.get("seconds", 0.0)
        # One thread: CPU time of the run's process ~ the phase's time alone on one core (wall time
        # on a shared machine includes waiting for other people's jobs). More threads: CPU time
        # counts every core, so wall time on an idle machine is the figure.
        basis = entry.get("cpu_seconds", seconds) if args.basis == "cpu" else seconds
        kind, _, gen = name.partition("_g")
        generation = int(gen) if gen.isdigit() else 0
        per_call_s = basis / calls if calls else 0.0
        per_call_tok = tokens.get("total_tokens", 0) / max(tokens.get("calls", 0), 1)
        n_paper = paper_calls(kind, generation, k_init=100, merges=2, e_i=2, t=20, **shares)
        paper_s = per_call_s * n_paper if calls else basis
        projected[kind] = projected.get(kind, 0.0) + paper_s
        rows.append(
            [
                name,
                f"{seconds:.1f}",
                f"{entry.get('cpu_seconds', seconds):.1f}",
                calls,
                tokens.get("total_tokens", 0),
                f"{per_call_s:.2f}",
                f"{per_call_tok:.0f}",
                f"{n_paper:.0f}",
                f"{paper_s / 60:.1f}",
            ]
        )
    total = sum(projected.values())
    table = tabulate(
        rows,
        headers=[
            "phase",
            "wall s",
            "CPU s",
            "LLM calls",
            "tokens",
            f"{args.basis} s/call",
            "tokens/call",
            "paper calls",
            "paper min",
        ],
    )
    lines = [
        table,
        "",
        f"load average during the run: {os.getloadavg()}",
        f"measured run: {args.agents} probes, E_m={args.merges}, E_i={args.rounds_per_merge}, "
        f"t={args.eval_rounds}, LLM {args.llm}, conversation {getattr(args, 'conversation', 'memory')}: "
        f"{sum(e.get('seconds', 0) for e in phases.values()):.0f} s",
        f"paper-size run (100 -> 50 -> 25, E_i=2, t=20) extrapolated from {args.basis} s per call "
        f"(CTRLSIM_THREADS={threads()}): {total / 60:.1f} min "
        f"({'within' if total <= GOAL_SECONDS else 'over'} the 30-minute goal by "
        f"{abs(GOAL_SECONDS - total) / 60:.1f} min)",
        "share of the extrapolated time by phase kind:",
    ]
    for kind, seconds in sorted(projected.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {kind:<9} {seconds / 60:6.1f} min  {100 * seconds / max(total, 1e-9):5.1f} %")
    return "\n".join(lines)


def threads() -> int:
    from ctrlsim.backends.specs import default_threads

    return default_threads()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--merges", type=int, default=2)
    parser.add_argument("--rounds-per-merge", type=int, default=2)
    parser.add_argument("--eval-rounds", type=int, default=2)
    parser.add_argument("--llm", default="qwen2.5-0.5b")
    parser.add_argument("--recommender", default="embedding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--conversation", default="memory", choices=["memory", "append"],
                        help="probe prompts in the loop's and the evaluation's rounds")
    parser.add_argument("--out", default=None, help="run folder (default: a fresh temporary folder)")
    parser.add_argument("--from-run", default=None, help="report an existing run folder instead of running")
    parser.add_argument("--resume", action="store_true",
                        help="resume the run folder --out from its last finished phase (the phases it "
                             "already holds keep the times measured then; a code change is allowed and "
                             "recorded in its provenance.jsonl)")
    parser.add_argument("--basis", default="auto", choices=["auto", "cpu", "wall"],
                        help="seconds per call from CPU time or wall time (auto: CPU time for one "
                             "llama.cpp thread, wall time for more; measure wall time on an idle machine)")
    args = parser.parse_args()
    if args.basis == "auto":
        args.basis = "cpu" if threads() == 1 else "wall"
    started = time.perf_counter()
    if args.from_run:
        folder = Path(args.from_run)
        phases = json.loads((folder / "phases.json").read_text())["phases"]
        config = json.loads((folder / "config.json").read_text())["config"]
        for key in ("agents", "merges", "rounds_per_merge", "eval_rounds", "llm"):
            setattr(args, key, config[key])
        args.conversation = config.get("conversation", "memory")
        records = [
            json.loads(line)
            for line in (folder / "records.jsonl").read_text().splitlines()[1:]
            if line.strip()
        ]
        for rec in records:
            if rec.get("key") == "evaluate":
                phases["evaluate"] = {
                    key: rec["record"][key]
                    for key in ("seconds", "cpu_seconds", "tokens")
                    if key in rec["record"]
                }
        debating = total = retried = outcomes = 0
        for path in folder.glob("clusters_g*.json"):
            c = json.loads(path.read_text())
            debating += sum(len(m) for m in c["members"] if len(m) >= 2)
            total += len(c["probe_ids"])
        for path in folder.glob("merge_g*.json"):
            out = json.loads(path.read_text())["outcomes"]
            retried += sum(o["retried"] for o in out)
            outcomes += len(out)
        shares = {"debating_share": debating / max(total, 1), "retry_share": retried / max(outcomes, 1)}
    else:
        phases, shares = measure(args)
    print(report(phases, shares, args))
    print(f"(benchmark wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
