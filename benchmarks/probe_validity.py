"""Which decision head and model make a probe act on its goal? (issue 42; docs/probe-validity.md)

For each (model, head) the same LLM personas (written once by `--persona-llm`, cached) take the two
fixed validity checks of `ctrlsim.agents.validity` on development targets that the main job does not
use, and the script prints adherence, fidelity AUC, CPU seconds per slate decision and parse failures,
with 95% cluster-bootstrap intervals (a cluster = one probe on one target and seed). Question heads
(yesno, twostep) log P(yes) per question, so every threshold of `--thresholds` is scored from one
reading; the chosen threshold per (model, head) maximises adherence + fidelity AUC on the development
targets. `--held-out` then scores each (model, head) at its chosen threshold on the held-out target,
read from the same kind of run, never used for the choice.

No response cache: every decision is computed, so CPU seconds compare. Run with nothing else on the
machine; the load average is printed.

    python benchmarks/probe_validity.py --models qwen2.5-0.5b --heads json,yesno,twostep
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from ctrlsim.agents import ProfileSettings
from ctrlsim.agents.llm_probe import DecisionSettings
from ctrlsim.agents.methods import MethodContext, Population
from ctrlsim.agents.validity import run_checks
from tabulate import tabulate

from ctrlsim.backends import load_llm
from ctrlsim.backends.bundled import cache_root
from ctrlsim.data import load_dataset
from ctrlsim.experiments.ctrlbench.inputs import target_items
from ctrlsim.metrics import validity as V

DEV_TARGETS = ("Horror", "Romance", "Sci-Fi")
HELD_OUT = "War+Film-Noir"


def personas_for(dataset, llm_spec: str, k: int, seed: int, target: str):
    ctx = MethodContext(
        dataset=dataset,
        recommender=None,
        target_tags=tuple(target.split("+")),
        target_items=frozenset(),
        seed=seed,
        k_large=k,
        k_small=k,
        rounds=4,
        slate_size=3,
        decision_settings=None,
        profile_settings=ProfileSettings(),
        llm_factory=lambda: load_llm(llm_spec),
        profile_store=cache_root() / "ctrlbench" / "profiles.sqlite",
    )
    personas, _ = ctx.base_personas(k)
    return personas


def passes(p: dict | None, head: str, threshold: float, goal: bool) -> bool:
    if p is None:
        return False
    values = [v for k, v in p.items() if goal or k != "p_goal"]
    return all(v is not None and v >= threshold for v in values)


def score(rows_check, rows_fid, like_check, like_fid) -> dict:
    adh = V.adherence_card([r["cluster"] for r in rows_check], [r["target"] for r in rows_check], like_check)
    rated = [(r, x) for r, x in zip(rows_fid, like_fid) if r["rating"] >= 4 or r["rating"] <= 2]
    auc = V.fidelity_auc(
        [r["cluster"] for r, _ in rated], [r["rating"] >= 4 for r, _ in rated], [float(x) for _, x in rated]
    )
    return {"adherence": adh, "fidelity": auc}


def fmt(e) -> str:
    if not np.isfinite(e.value):
        return "undefined"
    return f"{e.value:.2f} [{e.low:.2f}, {e.high:.2f}]" if np.isfinite(e.low) else f"{e.value:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen2.5-0.5b")
    ap.add_argument("--heads", default="json,yesno,twostep")
    ap.add_argument("--targets", default=",".join(DEV_TARGETS))
    ap.add_argument(
        "--held-out", default=None, help=f"score the chosen thresholds on this target ({HELD_OUT})"
    )
    ap.add_argument("--choice", default=None, help="a JSON file of chosen thresholds (written by a dev run)")
    ap.add_argument("--probes", type=int, default=8)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--persona-llm", default="qwen2.5-0.5b")
    ap.add_argument("--thresholds", default=",".join(f"{t:.3f}" for t in np.arange(0.3, 0.701, 0.025)))
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    dataset = load_dataset("ml-100k")
    thresholds = [float(t) for t in args.thresholds.split(",")]
    targets = [args.held_out] if args.held_out else args.targets.split(",")
    chosen = json.loads(Path(args.choice).read_text()) if args.choice else {}
    seeds = [int(s) for s in args.seeds.split(",")]
    print(
        f"load average before: {os.getloadavg()[0]:.2f}; targets {targets}; seeds {seeds}; "
        f"{args.probes} probes; personas by {args.persona_llm}"
    )
    rows, out, raw = [], [], []
    for model in args.models.split(","):
        llm = load_llm(model)  # no response cache: every decision is computed
        for head in args.heads.split(","):
            check, fid, cpu, slates, parse_failures = [], [], 0.0, 0, 0
            for target in targets:
                items = target_items(dataset, target)
                for seed in seeds:
                    personas = personas_for(dataset, args.persona_llm, args.probes, seed, target)
                    settings = DecisionSettings(decision=head, allow_search=False)
                    started = time.process_time()
                    result = run_checks(
                        Population(tuple(personas), "llm"),
                        dataset,
                        target_items=items,
                        target_name=target,
                        target_tags=target.split("+"),
                        seed=seed,
                        slate_size=3,
                        budget=4,
                        llm=llm,
                        settings=settings,
                    )
                    cpu += time.process_time() - started
                    slates += -(-len(result["check"]) // 3) + -(-len(result["fidelity_check"]) // 3)
                    parse_failures += result["check_parse_failures"]
                    check += [dict(d, cluster=f"{target}|{seed}|{d['probe']}") for d in result["check"]]
                    fid += [
                        dict(d, cluster=f"{target}|{seed}|{d['probe']}") for d in result["fidelity_check"]
                    ]
            raw += [dict(d, model=model, head=head, check="adherence") for d in check]
            raw += [dict(d, model=model, head=head, check="fidelity") for d in fid]
            grid = [None] if head == "json" else thresholds
            if args.held_out and head != "json":
                grid = [chosen.get(f"{model}|{head}", 0.5)]
            scored = []
            for t in grid:
                like_c = [d["liked"] if t is None else passes(d.get("p"), head, t, True) for d in check]
                like_f = [d["liked"] if t is None else passes(d.get("p"), head, t, False) for d in fid]
                scored.append((t, score(check, fid, like_c, like_f)))
            best_t, best = max(
                scored,
                key=lambda x: (
                    np.nan_to_num(x[1]["adherence"].adherence.value, nan=-9)
                    + np.nan_to_num(x[1]["fidelity"].value, nan=0)
                ),
            )
            for t, s in scored:
                rows.append(
                    [
                        model,
                        head,
                        "-" if t is None else t,
                        fmt(s["adherence"].adherence),
                        f"{100 * s['adherence'].like_target:.0f}% / {100 * s['adherence'].like_other:.0f}%",
                        fmt(s["fidelity"]),
                        f"{cpu / max(slates, 1):.2f}",
                        parse_failures,
                        "chosen" if t == best_t else "",
                    ]
                )
            out.append(
                {
                    "model": model,
                    "head": head,
                    "threshold": best_t,
                    "adherence": [
                        best["adherence"].adherence.value,
                        best["adherence"].adherence.low,
                        best["adherence"].adherence.high,
                    ],
                    "fidelity": [best["fidelity"].value, best["fidelity"].low, best["fidelity"].high],
                    "cpu_per_decision": cpu / max(slates, 1),
                    "parse_failures": parse_failures,
                }
            )
            print(f"  {model} {head}: {cpu:.0f} CPU s for {slates} slate decisions", flush=True)
        llm.close()
    print(
        tabulate(
            rows,
            headers=[
                "model",
                "head",
                "threshold",
                "adherence [95% CI]",
                "like target / other",
                "fidelity AUC [95% CI]",
                "CPU s / decision",
                "parse failures",
                "",
            ],
            tablefmt="github",
        )
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
        Path(args.out).with_suffix(".decisions.jsonl").write_text("".join(json.dumps(d) + "\n" for d in raw))
        if not args.held_out:
            Path(args.out).with_suffix(".choice.json").write_text(
                json.dumps(
                    {f"{o['model']}|{o['head']}": o["threshold"] for o in out if o["threshold"] is not None}
                )
            )


if __name__ == "__main__":
    main()
