"""What `ctrlsim audit BOX` runs: its config, its sizes, and which protocols apply to which box.

An audit is a list of **sub-runs**, each an ordinary run of one runner (ctrlbench, calibrate,
steereval, promptshift) in its own folder under the audit folder, driven by the same driver as
the runner's own command (so it resumes, runs on Ray, and fails loudly). `plan_subruns` turns an
`AuditConfig` into those sub-runs; nothing here loads data or models.

Which protocols apply:

* every `make_recommender` name (RecBole models, `dial:` boxes and `http(s)://` services included)
  gets CtrlBench-Rec (Tasks 1-3 from the same episodes) with LLM probes, the `oracle` upper bound
  and the `random` floor, and the ctrlbench calibration that places it on the dial's lambda scale
  for the same probes, seeds and sizes; and steer-then-release episodes (`persistence`, a ctrlbench
  run with `--task persistence`): does the steering last once the probes stop?; counterfactual
  arms with negative feedback (`responsiveness`, `--task responsiveness`): do the buttons work?;
  and the controls the box declares (`controls`, the `ctrlsim controls` runner; nothing where it
  declares none): does each do what it claims (DSA Art. 27), and is its non-profiled mode not
  profiled (Art. 38)?;
* a box that reads profile text gets SteerEval (and its calibration): `embedding` (SteerEval's
  embedding ranker) and `llm:SPEC` (the LLM scoring ranker);
* an LLM list generator, `llm:SPEC`, gets PromptShift (and its calibration). `llm:SPEC` is not
  a `make_recommender` box, so CtrlBench-Rec does not apply to it.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM
from ctrlsim.errors import ConfigError

REPORT, SUMMARY, AUDIT_FILE, COST_FILE = "report.html", "summary.json", "audit.json", "cost.jsonl"
DEFAULT_OUT = "results/audit"
AUDIT_DESCRIPTION = ("`ctrlsim audit BOX [--compare BOX2 ...]`: every protocol that applies to a box, "
                     "one report card.")
SIZES = ("small", "medium", "paper")
LLM_BOX = "llm:"
PROFILE_BOXES = {"embedding": "embedding"}  # box -> SteerEval condition whose ranker it is
LLM_CONDITION = "default"  # SteerEval's LLM-scoring condition, the ranker an `llm:SPEC` box is
PROBE_METHODS = ("base-small", "oracle", "random")
SUBRUN_PROTOCOLS = {"ctrlbench": "ctrlbench", "calibrate-ctrlbench": "calibrate", "persistence": "ctrlbench",
                    "responsiveness": "ctrlbench", "controls": "controls", "steereval": "steereval",
                    "calibrate-steereval": "calibrate", "promptshift": "promptshift",
                    "calibrate-promptshift": "calibrate"}

# The persistence sub-run's target. Not the ctrlbench sub-run's War+Film-Noir: Star Wars and other
# popular films carry War, so on the dial boxes (which start from the popularity ranking) its share
# before steering was already 58-67% and steering did not raise it (0 of 6 episodes at lambda 0.5),
# and the oracle raised it past the 5-point bar on embedding in 3 of 6. Crime starts at 15-28% and
# the oracle raised it in 5 of 6 episodes on embedding and dial:0.5 and 4 of 6 on dial:1:window=2,
# where the coin-flip probe did so in 1, 0 and 1 (Thriller starts at 51% on embedding and rises with
# coin flips on the dials). Measured 2026-12-05, 8 steering rounds, slates of 3 (docs/audit.md).
PERSISTENCE_TARGETS = ("Crime",)
_PERSISTENCE = {"baseline_rounds": 2, "rounds": 8, "release_rounds": 8, "seeds": (0, 1, 2, 3, 4, 5),
                "targets": PERSISTENCE_TARGETS, "task": "persistence"}

# Do the buttons work? Scripted coin-flip probes (no LLM: seconds) dismiss one item each at round 2
# and play 4 more rounds per arm; six seeds, so the pooled interval has items from every one.
_RESPONSIVENESS = {"task": "responsiveness", "methods": ("random",), "agents": (3, 3), "rounds": 4,
                   "seeds": (0, 1, 2, 3, 4, 5), "targets": ("War",)}
# Declared controls (none for most boxes: the sub-run then plans nothing and says so).
_CONTROLS = {"users": 20, "points": 5, "seeds": (0, 1)}

# Per size: the fields of each sub-run's config (fields given with `--config FILE` override them).
_SMALL: dict[str, dict[str, Any]] = {
    # Six seeds: the fewest with which a paired step test can reach p < 0.05 (the exact sign test's
    # smallest p is 2 / 2^n: 0.25 with three), so the LLM probe can resolve the dial and place the box.
    "ctrlbench": {"methods": PROBE_METHODS, "agents": (2, 1), "rounds": 4, "seeds": (0, 1, 2, 3, 4, 5),
                  "targets": ("War+Film-Noir",), "task": "profile-shaping"},
    "calibrate-ctrlbench": {"protocol": "ctrlbench", "methods": PROBE_METHODS, "dials": (0.0, 0.5, 1.0)},
    # the scripted probes only (no LLM: seconds); three probes an episode steady the per-round share
    "persistence": {**_PERSISTENCE, "methods": ("oracle", "random"), "agents": (3, 3)},
    "responsiveness": _RESPONSIVENESS,
    "controls": _CONTROLS,
    "steereval": {"tags": ("Comedy", "Action"), "users": 2, "pool_size": 60, "seed": 0},
    "calibrate-steereval": {"protocol": "steereval", "methods": ("template",), "dials": (0.0, 0.5, 1.0),
                            "seeds": (0,)},
    "promptshift": {"users": 4, "scenarios": ("gender",)},
    "calibrate-promptshift": {"protocol": "promptshift", "methods": ("b0",), "dials": (0.0, 0.5, 1.0),
                              "seeds": (0,), "users": 4, "scenarios": ("gender",)},
}
_MEDIUM: dict[str, dict[str, Any]] = {
    "ctrlbench": {"methods": PROBE_METHODS, "agents": (4, 2), "rounds": 8, "seeds": (0, 1, 2, 3, 4, 5),
                  "targets": ("War+Film-Noir",), "task": "profile-shaping"},
    "calibrate-ctrlbench": {"protocol": "ctrlbench", "methods": PROBE_METHODS,
                            "dials": (0.0, 0.25, 0.5, 0.75, 1.0)},
    "persistence": {**_PERSISTENCE, "methods": PROBE_METHODS, "agents": (3, 3)},
    "responsiveness": _RESPONSIVENESS,
    "controls": _CONTROLS,
    "steereval": {"tags": ("Action", "Comedy", "Romance", "Thriller"), "users": 5, "seed": 0},
    "calibrate-steereval": {"protocol": "steereval", "methods": ("template", "stronger", "weaker"),
                            "dials": (0.0, 0.25, 0.5, 0.75, 1.0), "seeds": (0, 1, 2)},
    "promptshift": {"users": 8},
    "calibrate-promptshift": {"protocol": "promptshift", "methods": ("b0", "b3"),
                              "dials": (0.0, 0.25, 0.5, 0.75, 1.0), "seeds": (0, 1, 2), "users": 8},
}
_PAPER: dict[str, dict[str, Any]] = {
    "ctrlbench": {"methods": PROBE_METHODS, "agents": (100, 26), "rounds": 20, "seeds": (0, 1, 2),
                  "targets": ("Action+Adventure+Thriller+War+Romance+Film-Noir",), "task": "profile-shaping"},
    "calibrate-ctrlbench": {"protocol": "ctrlbench", "methods": PROBE_METHODS,
                            "dials": (0.0, 0.25, 0.5, 0.75, 1.0)},
    # the paper's K_small probes and t = 20, with a release as long as the steering: 20 rounds give
    # NARM's and SASRec's 20-item window the time to turn over
    "persistence": {**_PERSISTENCE, "methods": PROBE_METHODS, "agents": (26, 26), "baseline_rounds": 4,
                    "rounds": 20, "release_rounds": 20},
    "responsiveness": {**_RESPONSIVENESS, "agents": (26, 26)},
    "controls": {**_CONTROLS, "users": 50, "seeds": (0, 1, 2)},
    "steereval": {"users": 10, "seed": 0},
    "calibrate-steereval": {"protocol": "steereval", "methods": ("template", "stronger", "weaker"),
                            "dials": (0.0, 0.25, 0.5, 0.75, 1.0), "seeds": (0, 1, 2), "users": 10},
    "promptshift": {},
    "calibrate-promptshift": {"protocol": "promptshift", "methods": ("b0", "b1", "b2", "b3"),
                              "dials": (0.0, 0.25, 0.5, 0.75, 1.0), "seeds": (0, 1, 2)},
}
SIZE_FIELDS: dict[str, dict[str, dict[str, Any]]] = {"small": _SMALL, "medium": _MEDIUM, "paper": _PAPER}


@dataclass(frozen=True)
class AuditConfig:
    """One audit: the boxes, the size, the probes' LLM and per-sub-run overrides."""

    boxes: tuple[str, ...]
    size: str = "small"
    llm: str = DEFAULT_PROBE_LLM
    dataset: str = "ml-100k"
    slate_size: int = 3
    # sub-run name -> config fields that override the size's (from `--config FILE`)
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self):
        if not self.boxes:
            raise ConfigError("audit: name at least one box")
        if len(set(self.boxes)) != len(self.boxes):
            raise ConfigError(f"audit: a box is given more than once in {list(self.boxes)}")
        if self.size not in SIZES:
            raise ConfigError(f"audit: --size must be one of {', '.join(SIZES)}, got {self.size!r}")
        # Every path to a sub-run's config passes here (`--config FILE`, Python, `--llms`), and what
        # passed is kept as a copy: a caller's dict changed later changes no audit.
        check_overrides(self.overrides)
        object.__setattr__(self, "overrides", {name: dict(fields) for name, fields in self.overrides.items()})
        llm_boxes = [b for b in self.boxes if is_llm_box(b)]
        if len({llm_spec(b) for b in llm_boxes}) > 1:
            raise ConfigError("audit: SteerEval scores with one LLM; give at most one llm:SPEC box")
        for box in self.boxes:
            if is_llm_box(box):
                if not llm_spec(box):
                    raise ConfigError(f"audit: {box!r} names no LLM (llm:SPEC, e.g. llm:qwen2.5-0.5b)")
                continue
            from ctrlsim.recommenders.registry import check_recommender_name

            check_recommender_name(box)

    @property
    def primary(self) -> str:
        return self.boxes[0]


def is_llm_box(box: str) -> bool:
    return box.startswith(LLM_BOX)


def llm_spec(box: str) -> str:
    return box[len(LLM_BOX):]


def reads_profile_text(box: str) -> bool:
    return box in PROFILE_BOXES or is_llm_box(box)


def steereval_condition(box: str) -> str:
    return LLM_CONDITION if is_llm_box(box) else PROFILE_BOXES[box]


def calibrate_box(box: str) -> str:
    """The name a box goes by in calibrate's `--compare` (steereval: `llm`/`embedding`; promptshift: spec)."""
    return llm_spec(box) if is_llm_box(box) else box


@dataclass(frozen=True)
class SubRun:
    """One sub-run: its name (also its folder), its runner, and its config fields."""

    name: str
    protocol: str
    fields: Mapping[str, Any]


def plan_subruns(config: AuditConfig) -> list[SubRun]:
    """The sub-runs that apply to the audited boxes, in the order they run (see the module docstring)."""
    sizes = SIZE_FIELDS[config.size]
    boxes = [b for b in config.boxes if not is_llm_box(b)]
    profile = [b for b in config.boxes if reads_profile_text(b)]
    generators = [b for b in config.boxes if is_llm_box(b)]
    llm = next((llm_spec(b) for b in generators), config.llm)
    common = {"dataset": config.dataset}
    fields: dict[str, dict[str, Any]] = {}
    if boxes:
        fields["ctrlbench"] = {**common, **sizes["ctrlbench"], "recommenders": tuple(boxes),
                               "llm": config.llm, "slate_size": config.slate_size}
        cb = {**fields["ctrlbench"], **config.overrides.get("ctrlbench", {})}
        # the same probes, sizes and seeds as the ctrlbench sub-run: a placement is for those probes
        fields["calibrate-ctrlbench"] = {**common, **sizes["calibrate-ctrlbench"], "compare": tuple(boxes),
                                         "llm": cb["llm"], "methods": tuple(cb["methods"]),
                                         "agents": tuple(cb["agents"]), "rounds": cb["rounds"],
                                         "seeds": tuple(cb["seeds"]), "targets": tuple(cb["targets"]),
                                         "slate_size": cb["slate_size"]}
        # its own target, phases and probes (see PERSISTENCE_TARGETS); the same boxes, LLM and slates
        fields["persistence"] = {**common, **sizes["persistence"], "recommenders": tuple(boxes),
                                 "llm": config.llm, "slate_size": config.slate_size}
        fields["responsiveness"] = {**common, **sizes["responsiveness"], "recommenders": tuple(boxes),
                                    "llm": config.llm, "slate_size": config.slate_size}
        fields["controls"] = {**common, **sizes["controls"], "boxes": tuple(boxes)}
    if profile:
        fields["steereval"] = {**common, **sizes["steereval"], "llm": llm,
                               "conditions": tuple(dict.fromkeys(steereval_condition(b) for b in profile))}
        se = {**fields["steereval"], **config.overrides.get("steereval", {})}
        compare = tuple("llm" if is_llm_box(b) else b for b in profile)
        fields["calibrate-steereval"] = {**common, **sizes["calibrate-steereval"], "compare": compare,
                                         "llm": se["llm"], "users": se["users"]}
        for name in ("tags", "pool_size"):  # the same scenarios as the steereval sub-run
            if se.get(name):
                fields["calibrate-steereval"][name] = tuple(se[name]) if name == "tags" else se[name]
    if generators:
        fields["promptshift"] = {**common, **sizes["promptshift"],
                                 "llms": tuple(llm_spec(b) for b in generators)}
        fields["calibrate-promptshift"] = {**common, **sizes["calibrate-promptshift"], "llm": llm,
                                           "compare": tuple(llm_spec(b) for b in generators)}
    return [SubRun(name, SUBRUN_PROTOCOLS[name], {**values, **config.overrides.get(name, {})})
            for name, values in fields.items()]


def subrun_config(subrun: SubRun) -> Any:
    """The runner's typed config of a sub-run (validated: a bad override is a `ConfigError` now)."""
    from ctrlsim.experiments.config import config_from_dict
    from ctrlsim.experiments.runner import get_runner

    try:
        return config_from_dict(get_runner(subrun.protocol).config_cls, dict(subrun.fields))
    except ConfigError as exc:
        raise ConfigError(f"audit sub-run {subrun.name}: {exc}") from None


# The fields the audit sets itself in each sub-run: the audited and compared boxes (and what is part
# of a box: the LLM inside an LLM-based box, SteerEval's conditions and encoder), the protocol a
# calibration places them with, the dataset, the slate size and the probes' LLM. No sub-run setting
# can change them: the report would name one box, dataset or model and measure another, and a
# calibration would place a box its protocol's sub-run did not run.
_SHARED_OWNED = ("dataset", "llm")
OWNED_FIELDS = {
    "ctrlbench": ("recommenders", "recommender_llm", "slate_size", *_SHARED_OWNED),
    "calibrate-ctrlbench": ("compare", "protocol", "slate_size", *_SHARED_OWNED),
    # the task too: a persistence sub-run that is not one would leave its section without numbers
    "persistence": ("recommenders", "recommender_llm", "slate_size", "task", *_SHARED_OWNED),
    "responsiveness": ("recommenders", "recommender_llm", "slate_size", "task", *_SHARED_OWNED),
    "controls": ("boxes", "dataset"),
    "steereval": ("conditions", "encoder", *_SHARED_OWNED),
    "calibrate-steereval": ("compare", "protocol", "slate_size", *_SHARED_OWNED),
    "promptshift": ("llms", "dataset"),
    "calibrate-promptshift": ("compare", "protocol", "slate_size", *_SHARED_OWNED),
}
# Options of a whole invocation, not of a sub-run's config: the audit passes its own to every sub-run.
AUDIT_LEVEL = ("config", "preset", "llms")


def check_overrides(overrides: Any) -> None:
    """Sub-run settings (sub-run name -> fields of its runner's config) name known sub-runs and known
    fields, spelled as fields; a run option (`out`, `executor`, ...), a flag (`--rounds`) or a field
    the audit owns (`OWNED_FIELDS`) is a `ConfigError` naming it. Values are checked by the runner's
    config when the sub-run's config is built (`subrun_config`)."""
    from ctrlsim.experiments.config import RunOptions
    from ctrlsim.experiments.runner import get_runner

    if not isinstance(overrides, Mapping) or not all(isinstance(v, Mapping) for v in overrides.values()):
        raise ConfigError("audit: the sub-run settings (--config) must hold an object of sub-run name -> "
                          "fields")
    run_options = {f.name for f in dataclasses.fields(RunOptions)}
    for name, fields in overrides.items():
        if name not in SUBRUN_PROTOCOLS:
            raise ConfigError(f"audit: --config names unknown sub-run {name!r}; sub-runs: "
                              f"{', '.join(SUBRUN_PROTOCOLS)}")
        protocol = SUBRUN_PROTOCOLS[name]
        known = {f.name for f in dataclasses.fields(get_runner(protocol).config_cls) if f.init}
        spelled = {key: str(key).lstrip("-").replace("-", "_") for key in fields}
        options = [k for k, n in spelled.items() if n not in known and (n in run_options or n in AUDIT_LEVEL)]
        if options:
            raise ConfigError(f"audit: --config {name}: {', '.join(map(repr, options))} "
                              f"{'is a run option' if len(options) == 1 else 'are run options'} of the "
                              "whole audit, not a sub-run setting: give it to `ctrlsim audit` itself (every "
                              "sub-run runs with the audit's)")
        owned = sorted(k for k, n in spelled.items() if n in OWNED_FIELDS[name])
        if owned:
            raise ConfigError(f"audit: --config {name}: {', '.join(map(str, owned))} is the audit's own "
                              "(the audited boxes come from BOX and --compare; the dataset, slate size and "
                              "LLM from --dataset, --slate-size and --llm)")
        unknown = sorted(str(k) for k, n in spelled.items() if n not in known)
        if unknown:
            raise ConfigError(f"audit: --config {name}: unknown field(s) {', '.join(unknown)} of "
                              f"`ctrlsim {protocol}`")
        flags = sorted(str(k) for k, n in spelled.items() if k != n)
        if flags:
            raise ConfigError(f"audit: --config {name}: {', '.join(map(repr, flags))} is spelled as a flag; "
                              f"give the config field name ({', '.join(repr(spelled[k]) for k in flags)}: "
                              f"`ctrlsim {protocol} --help` with underscores)")


def load_overrides(path: str | None) -> dict[str, dict[str, Any]]:
    """`--config FILE`: a JSON object of sub-run name -> config fields of its runner, e.g.
    `{"ctrlbench": {"rounds": 6, "seeds": [0, 1, 2, 3]}, "calibrate-ctrlbench": {"dials": [0, 0.5, 1]}}`.

    Field names are the runner's (`ctrlsim ctrlbench --help`, dashes as underscores); an unknown
    sub-run or field, a run option, or a field the audit owns (`OWNED_FIELDS`) is a `ConfigError`
    naming it (`check_overrides`, which `AuditConfig` runs again on whatever reaches it)."""
    import json

    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"audit: --config {path!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"audit: --config {path!r} is not JSON ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"audit: --config {path!r} must hold an object of sub-run name -> fields")
    check_overrides(data)
    return data


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctrlsim audit", description=AUDIT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Sub-runs: ctrlbench, calibrate-ctrlbench, persistence, responsiveness, controls (any box); "
               "steereval, "
               "calibrate-steereval (embedding, llm:SPEC); promptshift, calibrate-promptshift (llm:SPEC). "
               "docs/audit.md.")
    parser.add_argument("box", help="any make_recommender name (popularity, narm, dial:0.5, "
                                    "http://host:8000, ...), or llm:SPEC for an LLM list generator")
    parser.add_argument("--compare", nargs="+", default=[], metavar="BOX",
                        help="more boxes audited side by side, with paired comparisons against BOX")
    parser.add_argument("--size", choices=SIZES, default="small",
                        help="small (default; minutes on a 2-core CPU), medium, or paper (the papers' sizes)")
    parser.add_argument("--llm", default=DEFAULT_PROBE_LLM, help="the probes' LLM (a load_llm spec) "
                                                           f"[default: {DEFAULT_PROBE_LLM}]")
    parser.add_argument("--llms", default=None, metavar="A,B,...",
                        help="run the audit once per probe model, each into OUT/llm=<model>/, then say "
                             "whether the findings depend on which model played the user (instead of --llm)")
    parser.add_argument("--dataset", default="ml-100k", help="dataset name or path [default: ml-100k]")
    parser.add_argument("--slate-size", type=int, default=3,
                        help="items per slate for every box (one scale for the placement) [default: 3]")
    parser.add_argument("--config", default=None, metavar="FILE", dest="overrides",
                        help="a JSON file of sub-run name -> its runner's config fields, e.g. "
                             '{"ctrlbench": {"rounds": 6, "seeds": [0, 1, 2, 3]}} (docs/audit.md)')
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"audit folder [default: {DEFAULT_OUT}]")
    parser.add_argument("--overwrite", action="store_true",
                        help="move everything already in the audit folder (earlier sub-runs and report, or "
                             "another folder's files) into a new folder beside it")
    parser.add_argument("--executor", default="local", choices=["local", "ray"], help="where units run")
    parser.add_argument("--ray-address", default=None, help="Ray cluster address (with --executor ray)")
    parser.add_argument("--replay", default=None, help="answer HTTP boxes from an earlier run's exchanges")
    parser.add_argument("--replay-unverified", action="store_true",
                        help="--replay a log that fails its check (edited, or without digests); recorded")
    parser.add_argument("--allow-code-change", action="store_true",
                        help="resume sub-runs written by other ctrlsim code")
    return parser
