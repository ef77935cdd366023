"""`--llms A,B,...`: the same run once per probe model, then how much its numbers move with the model.

`drive_across_llms(runner, config, llms, options)` drives one ordinary run per probe model into
`OUT/llm=<model>/`, through the one driver (each sub-run resumes, extends and fails on its own). The
configs are identical except the runner's probe-LLM field (`Runner.scores.probe_llm_field`), so each
sub-folder holds exactly what `ctrlsim <protocol> --llm <model>` with the same flags writes. Every
model spec is checked before any model loads. Only when every sub-run finished every unit are the
analysis (`sensitivity.report`) and `OUT/sensitivity.md` / `OUT/sensitivity.json` written; a failed
sub-run is reported, nothing is analysed from partial data, and a rerun retries exactly its units.
"""
from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ctrlsim.errors import ConfigError, CtrlsimError
from ctrlsim.experiments.config import RunOptions, check_output_dir
from ctrlsim.experiments.sensitivity.report import SENSITIVITY_JSON, SENSITIVITY_MD

if TYPE_CHECKING:
    from ctrlsim.experiments.driver import RunResult
    from ctrlsim.experiments.runner import Runner

SUBFOLDER_PREFIX = "llm="


def llm_slug(spec: str) -> str:
    """A folder name for a model spec: the spec itself where it is a plain name, else its readable part
    and a digest of the whole spec (so two specs never share a folder)."""
    plain = re.sub(r"[^A-Za-z0-9._@+-]+", "_", spec).strip("_.")[:80]
    if plain == spec:
        return plain
    return f"{plain}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"


def model_folder(out: str | Path, spec: str) -> Path:
    """The sub-run folder of probe model `spec` under `out`."""
    return Path(out) / f"{SUBFOLDER_PREFIX}{llm_slug(spec)}"


def check_llm_list(llms: Sequence[str] | str, *, name: str = "--llms") -> tuple[str, ...]:
    """At least two distinct, non-empty model specs (each is checked for loading by the caller)."""
    specs = tuple(s.strip() for s in (llms.split(",") if isinstance(llms, str) else llms))
    if any(not s for s in specs):
        raise ConfigError(f"{name}: an empty model spec in {list(specs)}")
    if len(set(specs)) != len(specs):
        raise ConfigError(f"{name}: a model is given more than once in {list(specs)}")
    if len(specs) < 2:
        raise ConfigError(f"{name}: a probe-model sensitivity analysis needs two models or more, got "
                          f"{list(specs)}")
    return specs


def probe_field(runner: Runner) -> str:
    """The config field holding `runner`'s probe LLM; a `ConfigError` where it declares none."""
    scores = runner.scores
    if scores is None or not scores.probe_llm_field:
        raise ConfigError(f"--llms: {runner.name} declares no probe-LLM field (Runner.scores."
                          "probe_llm_field); a probe-model sensitivity run applies to runners that declare "
                          "one, such as ctrlbench and calibrate")
    return scores.probe_llm_field


class SensitivityFailedError(CtrlsimError, RuntimeError):
    """A sub-run of an `--llms` run had failed units: nothing was analysed (a rerun retries them)."""

    def __init__(self, result: SensitivityResult):
        self.result = result
        super().__init__(failure_text(result))


@dataclass
class SensitivityResult:
    """The sub-runs (probe model -> `RunResult`) and, once every one finished, the analysis."""

    protocol: str
    out: Path
    runs: dict[str, RunResult]
    analysis: dict = field(default_factory=dict)
    markdown: str = ""
    report: list = field(default_factory=list, repr=False)

    @property
    def failed(self) -> dict[str, dict[str, str]]:
        """Probe model -> its failed units (unit key -> reason)."""
        return {spec: dict(r.failed) for spec, r in self.runs.items() if r.failed}

    @property
    def ok(self) -> bool:
        return not self.failed


def failure_text(result: SensitivityResult) -> str:
    from ctrlsim.experiments.driver import failure_summary

    parts = [f"--llms: {len(result.failed)} of {len(result.runs)} sub-run(s) did not finish; no sensitivity "
             f"analysis was written to {result.out}. Rerun the same command to retry the failed units."]
    parts += [f"{spec} ({r.out}):\n{failure_summary(r)}" for spec, r in result.runs.items() if r.failed]
    return "\n".join(parts)


def _configs(runner: Runner, config: Any, llms: Sequence[str]) -> dict[str, Any]:
    name = probe_field(runner)
    return {spec: replace(config, **{name: spec}) for spec in check_llm_list(llms)}


def analyse_runs(runner: Runner, configs: Mapping[str, Any], records: Mapping[str, Mapping[str, dict]],
                 folders: Mapping[str, str]) -> tuple[dict, list]:
    """(analysis, report blocks) of finished sub-runs: `configs[model]`, `records[model]`."""
    from ctrlsim.experiments.scores import headline_metric, score_frame
    from ctrlsim.experiments.sensitivity import report

    first = next(iter(configs.values()))
    frames = {spec: score_frame(runner, configs[spec], records[spec]) for spec in configs}
    analysis = report.analyse(frames, headline_metric(runner, first))
    return analysis, report.blocks(analysis, protocol=runner.name, field=probe_field(runner), folders=folders)


def drive_across_llms(runner: Runner, config: Any, llms: Sequence[str], options: RunOptions | None = None, *,
                      show_progress: bool = True, resources: Mapping[str, Any] | None = None,
                      loaded: Mapping[str, Any] | None = None) -> SensitivityResult:
    """Drive `config` once per probe model in `llms` (see the module docstring); never raises for
    failed units (`SensitivityResult.failed`). `loaded` maps specs to loaded LLMs serving them here."""
    from ctrlsim.experiments.driver import check_model_fields, drive
    from ctrlsim.experiments.runfolder import artefact_path, move_aside
    from ctrlsim.experiments.sensitivity import report

    options = options or RunOptions()
    out = runner.out_for(options)
    check_output_dir(out)
    if (out / "config.json").is_file():
        raise ConfigError(f"--llms: {out} holds a run of its own; give the per-model runs a folder of their "
                          "own (--out)")
    configs = _configs(runner, config, llms)
    given = {**dict(resources or {}), **dict(loaded or {})}
    for sub in configs.values():  # every model spec, before any model loads
        check_model_fields(runner, sub, given)
    if out.is_dir() and not _own_folder(out):  # a folder of other files: nothing of it is deleted
        if not options.overwrite:
            raise ConfigError(f"--llms: output {str(out)!r} is a folder with other files in it, not the "
                              "per-model runs of a --llms run; choose another --out, or pass --overwrite "
                              "to move its contents into a new folder beside it")
        previous = move_aside(out)
        if previous is not None and show_progress:
            print(f"--overwrite: the previous contents of {out} are now in {previous}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    model_folders = {spec: artefact_path(out, model_folder(out, spec).name) for spec in configs}  # no link
    for name in (SENSITIVITY_MD, SENSITIVITY_JSON):  # never leave an analysis beside runs that may now fail
        artefact_path(out, name).unlink(missing_ok=True)
    runs: dict[str, RunResult] = {}
    for spec, sub in configs.items():
        folder = model_folders[spec]
        if show_progress:
            print(f"--llms: {runner.name} with {spec} -> {folder}", file=sys.stderr)
        runs[spec] = drive(runner, sub, replace(options, out=str(folder)), show_progress=show_progress,
                           resources=resources, llms=loaded)
    result = SensitivityResult(runner.name, out, runs)
    if not result.ok:
        return result
    folders = {spec: str(r.out) for spec, r in runs.items()}
    analysis, blocks = analyse_runs(runner, configs, {s: r.records_by_key for s, r in runs.items()}, folders)
    about = {"protocol": runner.name, "probe_llm_field": probe_field(runner), "folders": folders}
    result.analysis, result.report = analysis, blocks
    result.markdown = report.write(out, analysis, blocks, about)
    return result


def _own_folder(out: Path) -> bool:
    """Whether `out` holds only what a --llms run writes there (its per-model runs and analysis)."""
    return all(p.name.startswith(SUBFOLDER_PREFIX) or p.name in (SENSITIVITY_MD, SENSITIVITY_JSON)
               for p in out.iterdir())


def run_across_llms(protocol: str, llms: Sequence[str], /, out: str | Path | None = None, *,
                    config: Any = None, options: RunOptions | None = None, show_progress: bool = True,
                    raise_on_failure: bool = True, resources: Mapping[str, Any] | None = None,
                    loaded: Mapping[str, Any] | None = None, **config_fields: Any) -> SensitivityResult:
    """`ctrlsim.run`'s twin for `--llms`: the run of `protocol` (config fields or `config=`, a preset
    with `preset=`) once per probe model in `llms`, each into `out/llm=<model>/`, and the analysis
    (`SensitivityResult.analysis`, also in `out/sensitivity.json`). Failed units raise
    `SensitivityFailedError` unless `raise_on_failure=False`."""
    from ctrlsim.experiments.config import config_from_dict
    from ctrlsim.experiments.driver import with_presets
    from ctrlsim.experiments.runner import get_runner

    runner = get_runner(protocol)
    name = probe_field(runner)
    if config is None:
        fields = with_presets(runner, config_fields)
        if name in config_fields:
            raise ConfigError(f"run_across_llms: the probe models are `llms`; give no {name}= as well")
        fields.pop(name, None)
        config = config_from_dict(runner.config_cls, fields)
    elif config_fields:
        raise ConfigError(f"run_across_llms: give config= or config fields, not both "
                          f"({sorted(config_fields)})")
    options = options or RunOptions()
    if out is not None:
        options = replace(options, out=str(out))
    result = drive_across_llms(runner, config, llms, options, show_progress=show_progress,
                               resources=resources, loaded=loaded)
    if result.failed and raise_on_failure:
        raise SensitivityFailedError(result)
    return result


def sensitivity_main(runner: Runner, config: Any, options: RunOptions, llms: Sequence[str]) -> int:
    """`ctrlsim <protocol> --llms A,B ...`: exit 0 with the analysis, 1 when a sub-run failed (none)."""
    result = drive_across_llms(runner, config, llms, options)
    if result.failed:
        print(failure_text(result), file=sys.stderr)
        return 1
    print(result.markdown)
    print(f"\nper-model run folders: {', '.join(str(r.out) for r in result.runs.values())}; analysis: "
          f"{result.out / SENSITIVITY_MD} ({SENSITIVITY_JSON})", file=sys.stderr)
    return 0
