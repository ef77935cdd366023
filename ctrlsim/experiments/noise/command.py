"""`ctrlsim noise RUN --out DIR`: rerun, compare, and write `DIR/noise.md` and `DIR/noise.json`.

DIR is an ordinary run folder of RUN's runner (its tables, records and response cache are its own),
so the same command resumes an interrupted rerun and then rewrites the report. Exit status: 0 with a
report, 1 when units of the rerun failed (they are listed; the same command retries them; no report
is written from a partial rerun), 2 for a bad value (RUN not a finished run folder, DIR the run
itself, a runner without per-observation scores: nothing ran), 130 on Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ctrlsim.experiments.config import EXECUTORS, _parse_bool
from ctrlsim.experiments.noise.rerun import DEFAULT_ORDER_SEED, DEFAULT_PARALLEL

if TYPE_CHECKING:
    from ctrlsim.experiments.noise.rerun import NoiseRerun
    from ctrlsim.experiments.tables import Block

NOISE_MD = "noise.md"
NOISE_JSON = "noise.json"


@dataclass
class NoiseResult:
    """A noise run: the rerun, the comparison as data (`analysis`, noise.json's numbers) and its report."""

    out: Path
    rerun: NoiseRerun = field(repr=False)
    analysis: dict
    report: list[Block] = field(repr=False)
    markdown: str


def _plain(obj: Any) -> Any:
    """JSON-safe: NaN and infinities become null, tuples lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def run_noise(run: str | Path, out: str | Path, *, parallel: int = DEFAULT_PARALLEL,
              order_seed: int = DEFAULT_ORDER_SEED, executor: str = "local", ray_address: str | None = None,
              figures: bool = False, allow_code_change: bool = False,
              show_progress: bool = True) -> NoiseResult:
    """Rerun `run` into `out` (`noise.rerun.rerun`), compare the two (`noise.report.compare`) and write
    `out/noise.md` and `out/noise.json`. Failed units of the rerun raise `RunFailedError`."""
    from ctrlsim.atomic import atomic_write_text
    from ctrlsim.experiments.noise.report import blocks, compare, noise_json
    from ctrlsim.experiments.noise.rerun import renamed_specs, rerun
    from ctrlsim.experiments.scores import score_frame
    from ctrlsim.experiments.tables import render_markdown

    done = rerun(run, out, parallel=parallel, order_seed=order_seed, executor=executor,
                 ray_address=ray_address, figures=figures, allow_code_change=allow_code_change,
                 show_progress=show_progress)
    runner, scores = done.runner, done.runner.scores
    assert scores is not None  # rerun() refuses a runner without scores
    before = score_frame(runner, done.config, done.records)
    after = score_frame(runner, done.rerun_config, done.result.records_by_key)
    reference = scores.reference(done.config) if scores.reference is not None else None
    analysis = _plain(compare(before, after, reference=reference, renames=renamed_specs(done.changes)))
    about = done.about()
    report = blocks(about, analysis)
    markdown = render_markdown(report)
    folder = Path(out)
    atomic_write_text(folder / NOISE_MD, markdown)
    atomic_write_text(folder / NOISE_JSON, json.dumps(_plain(noise_json(about, analysis, report)), indent=2,
                                                      allow_nan=False) + "\n")
    return NoiseResult(folder, done, analysis, report, markdown)


def build_parser() -> argparse.ArgumentParser:
    from ctrlsim.backends.llamacpp.profile import DEFAULT_PROFILE, PROFILES

    width = PROFILES[DEFAULT_PROFILE].n_parallel
    parser = argparse.ArgumentParser(
        prog="ctrlsim noise", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Rerun a finished run's units without its response cache, in another batch layout "
                    "(units shuffled, another llama.cpp width), and report per metric how far each "
                    "observation moved, which paired verdicts flipped, and each paired comparison's minimum "
                    "detectable effect (docs/statistics.md, 'Noise floor').")
    parser.add_argument("run", help="the finished run folder to measure")
    parser.add_argument("--out", required=True,
                        help="the rerun's own run folder (noise.md and noise.json are written there); "
                             "rerun the same command to resume it")
    parser.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL, metavar="N",
                        help="sequences llama.cpp decodes side by side in the rerun, for every LLM spec on "
                             f"llama.cpp (the default profile: {width}; 1: every reply alone, the sequential "
                             f"path, slower on big runs; 2..{width - 1} re-split only calls larger than N) "
                             f"[default: {DEFAULT_PARALLEL}]")
    parser.add_argument("--order-seed", type=int, default=DEFAULT_ORDER_SEED, metavar="N",
                        help=f"seed of the rerun's shuffled unit order [default: {DEFAULT_ORDER_SEED}]")
    parser.add_argument("--executor", choices=EXECUTORS, default="local", help="where the rerun's units run")
    parser.add_argument("--ray-address", default=None, help="Ray cluster for --executor ray")
    parser.add_argument("--figures", type=_parse_bool, default=False,
                        help="write the rerun's figures/*.png [default: false]")
    parser.add_argument("--allow-code-change", type=_parse_bool, nargs="?", const=True, default=False,
                        help="resume a rerun folder written by other ctrlsim code or library versions")
    return parser


def noise_main(argv: Sequence[str] | None = None) -> int:
    """`ctrlsim noise RUN --out DIR` (see the module docstring for the exit status)."""
    from ctrlsim.experiments.driver import RunFailedError, failure_summary

    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    try:
        result = run_noise(args.run, args.out, parallel=args.parallel, order_seed=args.order_seed,
                           executor=args.executor, ray_address=args.ray_address, figures=args.figures,
                           allow_code_change=args.allow_code_change)
    except RunFailedError as exc:
        print(failure_summary(exc.result), file=sys.stderr)
        print("ctrlsim noise: no report from a partial rerun; the same command retries the failed units",
              file=sys.stderr)
        return 1
    print(result.markdown)
    print(f"\nnoise report: {result.out / NOISE_MD} (numbers: {result.out / NOISE_JSON}; "
          f"{time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0
