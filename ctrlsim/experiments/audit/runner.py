"""`ctrlsim audit BOX [--compare BOX2 ...]`: every protocol that applies to a box, one report card.

The audit runs its sub-runs (`audit.config.plan_subruns`) one after the other through the driver, each
into its own run folder under the audit folder (`<out>/ctrlbench`, ...), so a rerun resumes every one
and `--executor ray` scales them out. Only when every sub-run finished every unit does it write
`<out>/summary.json` and `<out>/report.html`. A sub-run with failed units stops the audit (exit 1, no
report; an earlier one is removed first). `--llms A,B`: once per probe model (`audit.sensitivity`).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from ctrlsim.experiments.audit.config import REPORT, SUMMARY, AuditConfig, build_parser, load_overrides
from ctrlsim.experiments.audit.sensitivity import across_llms_main
from ctrlsim.experiments.audit.units import AuditFailedError, run_audit
from ctrlsim.experiments.config import RunOptions


def audit_main(argv: Sequence[str] | None = None) -> int:
    """`ctrlsim audit ...`: exit 0 with a report, 1 when a sub-run failed (no report), 2 for a bad value."""
    args = build_parser().parse_args(argv)
    config = AuditConfig(boxes=(args.box, *args.compare), size=args.size, llm=args.llm, dataset=args.dataset,
                         slate_size=args.slate_size, overrides=load_overrides(args.overrides))
    options = RunOptions(out=args.out, overwrite=args.overwrite, executor=args.executor,
                         ray_address=args.ray_address, replay=args.replay,
                         replay_unverified=args.replay_unverified, allow_code_change=args.allow_code_change)
    try:
        if args.llms is not None:
            return across_llms_main(config, args.llms, options, args.llm)
        summary = run_audit(config, options)
    except AuditFailedError as exc:
        from ctrlsim.redact import redact_secrets

        print(f"ctrlsim audit: {redact_secrets(str(exc))}", file=sys.stderr)
        return 1
    for line in summary["headline_text"]:
        print(line)
    cost = summary["cost"]
    print(f"\nreport: {Path(args.out) / REPORT} (numbers: {Path(args.out) / SUMMARY}; this run "
          f"{cost['wall_s']:.0f} s wall, {cost['cpu_s']:.0f} s CPU; the audit in all "
          f"{cost['total_wall_s']:.0f} s wall, {cost['total_cpu_s']:.0f} s CPU)", file=sys.stderr)
    return 0

