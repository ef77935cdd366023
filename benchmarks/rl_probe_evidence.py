"""Evidence that a learned probe learns something real (issue 23, point 3), and a negative control.

Trains one PPO probe per box with `ctrlsim train-probe` (search off, likes only), then evaluates it
with `ctrlsim ctrlbench` beside `random` and `oracle` on the same seeds and users, and prints the
paired Coverage difference (learned - random) with its 95% t interval and the Wilcoxon p-value:

    dial:1      likes steer the slates (each position follows the likes' tags): the learned probe
                should beat random, with a CI that excludes zero;
    dial:0      the slates ignore the user (popularity): no probe can change Coverage, so the
                difference must be zero (negative control);
    popularity  the same negative control on a real box, with the dial:1 policy.

    python benchmarks/rl_probe_evidence.py                    # 30,000 steps per policy, 5 seeds
    python benchmarks/rl_probe_evidence.py --timesteps 10000 --seeds 0,1,2,3,4,5,6,7,8,9

Writes its folders under --work (default a fresh temporary folder) and a JSON summary with --save.
Takes about 3 minutes on the 2-core development machine at the defaults (one core for training).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def coverage_at_end(records: list[dict], method: str, box: str) -> dict[int, float]:
    return {
        r["seed"]: r["curves"]["coverage"][-1]
        for r in records
        if r["method"] == method and r["recommender"] == box
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timesteps", type=int, default=30_000)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="ctrlbench evaluation seeds")
    parser.add_argument("--target", default="War")
    parser.add_argument("--probes", type=int, default=8, help="K_small: probes per evaluation episode")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--work", default=None)
    parser.add_argument("--save", default=None, help="write the summary here as JSON")
    args = parser.parse_args(argv)

    import os

    import ctrlsim
    from ctrlsim.metrics.stats import mean_ci, paired_comparison

    work = Path(args.work or tempfile.mkdtemp(prefix="rl-evidence-"))
    seeds = tuple(int(s) for s in args.seeds.split(","))
    print(f"work folder {work}; load average {os.getloadavg()[0]:.2f} at start")
    policies = {}
    for box in ("dial:1", "dial:0"):
        began = time.perf_counter()
        out = work / f"policy-{box.replace(':', '')}"
        result = ctrlsim.run(
            "train-probe",
            out=out,
            recommender=box,
            target=(args.target,),
            timesteps=args.timesteps,
            seed=0,
            show_progress=False,
        )
        meta = result.records_by_key["policy"]
        policies[box] = out
        print(
            f"trained on {box}: {meta['timesteps']:,} steps in {time.perf_counter() - began:.0f} s "
            f"({meta['cpu_seconds']:.0f} s CPU); last-50-episode training Coverage {meta['final_coverage']}"
        )
    evaluations = {
        "dial:1": policies["dial:1"],
        "dial:0": policies["dial:0"],
        "popularity": policies["dial:1"],
    }
    summary = {"timesteps": args.timesteps, "seeds": list(seeds), "target": args.target, "boxes": {}}
    rows = []
    for box, policy in evaluations.items():
        method = f"rl:{policy}"
        result = ctrlsim.run(
            "ctrlbench",
            out=work / f"eval-{box.replace(':', '')}",
            show_progress=False,
            methods=("random", "oracle", method),
            recommenders=(box,),
            targets=(args.target,),
            seeds=seeds,
            agents=(args.probes, args.probes),
            rounds=args.rounds,
            reference="random",
            cache=False,
        )
        records = result.records
        cov = {m: coverage_at_end(records, m, box) for m in ("random", "oracle", method)}
        learned = [cov[method][s] for s in seeds]
        random = [cov["random"][s] for s in seeds]
        test = paired_comparison(learned, random)
        entry = {
            "learned": mean_ci(learned).__dict__,
            "random": mean_ci(random).__dict__,
            "oracle": mean_ci([cov["oracle"][s] for s in seeds]).__dict__,
            "difference": test.difference.__dict__,
            "wilcoxon_p": test.p_wilcoxon,
            "wins": test.wins,
            "losses": test.losses,
            "policy": str(policy),
        }
        summary["boxes"][box] = entry
        d = test.difference
        rows.append(
            [
                box,
                Path(policy).name,
                f"{100 * entry['random']['value']:.1f}",
                f"{100 * entry['learned']['value']:.1f}",
                f"{100 * entry['oracle']['value']:.1f}",
                f"{100 * d.value:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}]",
                f"{test.wins}/{len(seeds) - test.wins - test.losses}/{test.losses}",
                f"{test.p_wilcoxon:.3g}",
            ]
        )
    from tabulate import tabulate

    print()
    print(
        tabulate(
            rows,
            headers=[
                "box",
                "policy",
                "random Cov%",
                "learned Cov%",
                "oracle Cov%",
                "learned - random (pp) [95% CI]",
                "wins/ties/losses",
                "Wilcoxon p",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    if args.save:
        Path(args.save).write_text(json.dumps(summary, indent=2, default=float) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
