"""`ctrlsim calibrate`: does a protocol, with these probes, detect controllability, and how finely?

A measuring instrument is calibrated against references whose answer is known. The references
are the dial boxes of `ctrlsim.recommenders.dial` (and its SteerEval and PromptShift siblings):
lambda = 0 ignores the user, lambda = 1 follows what the user liked or said. This runner runs a
protocol's probes (its methods) against dial boxes over a lambda grid and several seeds, through
the same driver as every runner (run folder, resume, executor, failure policy), and optionally
against real boxes (`--compare`) to place them on the dial's scale.

Units: `<method>|<box>|seed=<N>`, the box a dial spec (`dial:0.25`) or a compared box name. A unit
measures the protocol's metric on every one of its observations (a ctrlbench episode per target,
a SteerEval scenario, a PromptShift user x scenario) and stores them by observation id; tables
pair observations by that id across lambdas. Per protocol:

  ctrlbench    methods: any ctrlbench method (oracle, random, base-small, ..., module:attribute);
               metrics: Coverage at the last round (%) and Exposure (% of the target the box put
               on a recommender slate); compare: any `make_recommender` name (narm, sasrec, ...)
  steereval    methods: template, stronger, weaker (no LLM), llm-append, llm-rewrite;
               metric: signed Delta-AUC_t (negated for decrease edits: > 0 = steered as asked);
               boxes: `dial-profile` rankers; compare: the SteerEval rankers llm, embedding
  promptshift  methods: b0 (the cued list as generated) and the rerankers b1, b2, b3 applied to it;
               metrics: Drift against L^0 and SliceShift; boxes: dial list generators; compare: an
               LLM spec (the list generator PromptShift normally runs)

`--task persistence` (ctrlbench only) calibrates the steer-then-release measurement instead: its
boxes are `dial:1:window=W` for each of `--windows` and the unbounded `dial:1` (a random base
ranking unless `--dial-options` names one; the lambda grid is not used), its observations are the
episodes of `ctrlsim ctrlbench --task persistence` (baseline, `--rounds` of steering, release), and
its tables (`ctrlsim.experiments.calibrate.persistence`) say whether the measured half-life rises
with W and whether the unbounded box keeps the steering through the release.

The tables (`ctrlsim.experiments.calibrate.report`): each method's metric at every lambda with
its 95% CI, Spearman's rho between lambda and the metric with a cluster-bootstrap CI, the lambda
= 0 value against its known answer, the resolution (the smallest lambda step every pair of grid
points that far apart is told apart at p < 0.05), and each compared box's matched lambda with an
interval. docs/calibration.md says how to read them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ctrlsim.agents.llm_probe import DECISION_HEADS, DEFAULT_DECISION, DEFAULT_THRESHOLD
from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM, SMALLEST_LLM
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    DEFAULT_SUCCESS,
    MAX_AGENTS,
    MAX_ITEMS,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SLATE,
    MAX_USERS,
    check_fields,
    option,
)

DEFAULT_OUT = "results/calibrate"
PROTOCOLS = ("ctrlbench", "steereval", "promptshift")
DEFAULT_DIALS = (0.0, 0.25, 0.5, 0.75, 1.0)
# What a ctrlbench calibration measures: Coverage and Exposure against lambda, or the half-life of
# steering against the dial's memory window (`--task persistence`, docs/calibration.md).
TARGET_DISCOVERY = "target-discovery"
PERSISTENCE = "persistence"
TASKS = (TARGET_DISCOVERY, PERSISTENCE)
# The oracle halves in about W/2 release rounds on dial:1:window=W:base=random (Sci-Fi, K = 1,
# slates of 3): 2 rounds at W = 4, 4 at W = 8, while W = 16, like no window, keeps the steering
# through the default release, so three seeds tell every pair apart. W = 2 also steers episodes
# that larger windows do not, and never forgets them (docs/calibration.md, "Persistence").
DEFAULT_WINDOWS = (4, 8, 16)
DEFAULT_BASELINE = 2
DEFAULT_RELEASE = 6
# The persistence boxes' base ranking unless --dial-options names one: the popularity ranking is
# rich in Sci-Fi and War films, so the baseline share of such a target starts high and the oracle's
# half-life does not follow W (docs/calibration.md).
PERSISTENCE_BASE = "base=random"
# ctrlbench's persistence observations (its observe keys); the first is the per-observation
# headline score of noise and sensitivity reports: the retention area, which nothing censors.
PERSISTENCE_METRICS = ("area", "half_life", "relapse", "s0", "s_star")
PERSISTENCE_METHODS = ("oracle",)

@dataclass(frozen=True)
class CalibrateConfig:
    """One calibration: a protocol's methods against dial boxes over a lambda grid (config.json)."""

    protocol: str = option("ctrlbench", "the protocol calibrated", choices=PROTOCOLS)
    methods: tuple[str, ...] = option((), "probe methods (default per protocol: ctrlbench oracle,random; "
                                      "steereval template,stronger,weaker; promptshift b0,b3)")
    dials: tuple[float, ...] = option(DEFAULT_DIALS, "the lambda grid, values in [0, 1]")
    seeds: tuple[int, ...] = option((0, 1, 2), "seeds (users sampled, probes, ties); each adds observations",
                                    low=0, high=MAX_SEED)
    compare: tuple[str, ...] = option((), "real boxes to place on the dial's scale (ctrlbench: "
                                      "make_recommender names; steereval: llm, embedding; promptshift: LLM "
                                      "specs)")
    dial_options: tuple[str, ...] = option((), "key=value options of every dial box, e.g. "
                                           "base=random,mix=scores (docs/calibration.md)")
    dataset: str = option("ml-100k", "dataset name or path")
    llm: str = option(DEFAULT_PROBE_LLM, "the LLM of LLM methods (ctrlbench probes, SteerEval LLM edits, a "
                      "SteerEval llm ranker)")
    targets: tuple[str, ...] = option(("War+Film-Noir",), "(ctrlbench) target sets: a tag or a '+' union of "
                                      "tags")
    agents: tuple[int, ...] = option((4, 1), "(ctrlbench) K_large,K_small; one probe by default, so the "
                                     "target-seeking reference measures the box, not the diversity of "
                                     "identical probes (docs/calibration.md)", low=1, high=MAX_AGENTS)
    rounds: int = option(4, "(ctrlbench) interaction rounds per episode", low=1, high=MAX_ROUNDS)
    slate_size: int = option(3, "(ctrlbench) items per slate, the same for every box: a compared box is on "
                             "the dial's scale only at the dial's slate size (ctrlbench itself gives narm "
                             "20)", low=1, high=MAX_SLATE)
    tags: tuple[str, ...] = option(("Action", "Comedy", "Romance", "Thriller"), "(steereval) tags to steer")
    users: int = option(5, "(steereval) users per tag; (promptshift) users sampled per seed", low=1,
                        high=MAX_USERS)
    pool_size: int = option(100, "(steereval) items ranked per scenario", low=1, high=MAX_ITEMS)
    scenarios: tuple[str, ...] = option(("gender", "age", "gender_age"), "(promptshift) identity-cue "
                                        "scenarios")
    n_candidates: int = option(30, "(promptshift) N, items per generated list", low=1, high=MAX_SLATE)
    k: int = option(20, "(promptshift) K, the evaluated list length", low=1, high=MAX_SLATE)
    decision: str = option(DEFAULT_DECISION, "how ctrlbench's LLM probes decide: json, yesno or twostep "
                           "(`ctrlsim ctrlbench --help`)", choices=DECISION_HEADS)
    decision_threshold: float = option(DEFAULT_THRESHOLD, "P(yes) at or above which a question head likes "
                                       "an item, in (0, 1)")
    success_threshold: float = option(DEFAULT_SUCCESS, "(ctrlbench) Coverage share at the last round at or "
                                      "above which an episode succeeds, for pass^k (changes tables, not "
                                      "records)", low=0.0, high=1.0, omit_default=True)
    cache: bool = option(True, "keep LLM replies and personas in the run's response cache (the run folder, "
                         "and --shared-cache where given; replays are free)")
    task: str = option(TARGET_DISCOVERY, "(ctrlbench) what is calibrated: target-discovery (Coverage and "
                       "Exposure against the lambda grid) or persistence (the half-life of steering against "
                       "the memory window W of dial:1:window=W, and the unbounded dial:1; "
                       "docs/calibration.md)", choices=TASKS, omit_default=True)
    windows: tuple[int, ...] = option(DEFAULT_WINDOWS, "(--task persistence) the dial boxes' memory windows "
                                      "W (followed likes remembered); the unbounded dial:1 always runs too",
                                      low=1, high=MAX_ITEMS, omit_default=True)
    baseline_rounds: int = option(DEFAULT_BASELINE, "(--task persistence) rounds before steering: probes "
                                  "without a goal", low=1, high=MAX_ROUNDS, omit_default=True)
    release_rounds: int = option(DEFAULT_RELEASE, "(--task persistence) rounds after steering stops (the "
                                 "probes' baseline policy); a half-life not reached by then is censored",
                                 low=1, high=MAX_ROUNDS, omit_default=True)

    def __post_init__(self):
        from ctrlsim.recommenders.dial import check_lambda, format_lambda

        check_fields(self)
        from ctrlsim.agents.llm_probe import check_decision

        check_decision(self.decision, self.decision_threshold)  # before any model loads
        self._check_task()
        if not self.dials:
            raise ConfigError("dials: the lambda grid is empty; give at least two values in [0, 1]")
        grid = [check_lambda(v, name="dials") for v in self.dials]
        if len({format_lambda(v) for v in grid}) != len(grid):
            raise ConfigError(f"dials: a lambda is given more than once in {list(self.dials)}")
        if len(grid) < 2:
            raise ConfigError("dials: a calibration needs at least two lambdas (e.g. 0,1)")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")
        for pair in self.dial_options:
            key, sep, value = pair.partition("=")
            if not sep or not key or not value or ":" in pair or "|" in pair:
                raise ConfigError(f"dial_options: {pair!r} is not key=value")
        if len(set(self.compare)) != len(self.compare):
            raise ConfigError(f"compare: a box is given more than once in {list(self.compare)}")
        if self.k > self.n_candidates:
            raise ConfigError(f"k ({self.k}) must not exceed n_candidates ({self.n_candidates})")
        self._check_methods()
        # The protocol's own config validates the rest (targets, agents, tags, pool size, ...)
        # and the dial boxes' options, all before any model loads.
        protocol_config(self, self.all_methods[0], self.boxes()[0], self.seeds[0])
        self.check_boxes()

    def _check_task(self) -> None:
        """The task's own fields: persistence is ctrlbench's, and only it takes windows and phases."""
        if self.task != TARGET_DISCOVERY and self.protocol != "ctrlbench":
            raise ConfigError(f"task {self.task!r} is ctrlbench's; protocol {self.protocol} calibrates its "
                              f"one measurement (leave --task at {TARGET_DISCOVERY})")
        if not self.persistence:
            if (tuple(self.windows) != DEFAULT_WINDOWS or self.baseline_rounds != DEFAULT_BASELINE
                    or self.release_rounds != DEFAULT_RELEASE):
                raise ConfigError("windows, baseline_rounds and release_rounds belong to --task persistence "
                                  f"(the task is {self.task!r})")
            return
        if not self.windows:
            raise ConfigError("windows: no memory window given; give at least one, e.g. 4,8,16")
        if len(set(self.windows)) != len(self.windows):
            raise ConfigError(f"windows: a window is given more than once in {list(self.windows)}")
        if tuple(float(v) for v in self.dials) != DEFAULT_DIALS:
            raise ConfigError("dials: --task persistence does not use the lambda grid; its boxes are "
                              "dial:1:window=W for each of --windows and the unbounded dial:1")
        if any(pair.partition("=")[0] == "window" for pair in self.dial_options):
            raise ConfigError("dial_options: --task persistence sets each box's window from --windows")

    def _check_methods(self) -> None:
        methods = self.all_methods
        if len(set(methods)) != len(methods):
            raise ConfigError(f"methods: a method is given more than once in {list(methods)}")
        for method in methods:
            if "|" in method or not method.strip():
                raise ConfigError(f"methods: {method!r} is empty or contains '|'")
        self.observation.check_methods(methods)

    def check_boxes(self) -> None:
        """Every dial box spec parses and every compared box is one the protocol can run."""
        from ctrlsim.recommenders.dial import check_dial_spec

        for box in self.dial_boxes():
            check_dial_spec(box)
        for box in self.compare:
            if "|" in box or not box.strip():
                raise ConfigError(f"compare: {box!r} is empty or contains '|'")
            self.observation.check_compare(box)

    # ------------------------------------------------------------------ derived
    @property
    def observation(self):
        """The calibrated protocol's observation function (`ctrlsim.experiments.runner.Observation`)."""
        from ctrlsim.experiments.runner import get_runner

        observation = get_runner(self.protocol).observation
        assert observation is not None, f"{self.protocol} declares no observation function"
        return observation

    @property
    def persistence(self) -> bool:
        return self.task == PERSISTENCE

    @property
    def all_methods(self) -> tuple[str, ...]:
        return self.methods or (PERSISTENCE_METHODS if self.persistence else self.observation.default_methods)

    @property
    def grid(self) -> tuple[float, ...]:
        return tuple(sorted(float(v) for v in self.dials))

    @property
    def metrics(self) -> tuple[str, ...]:
        return PERSISTENCE_METRICS if self.persistence else self.observation.metrics

    @property
    def episode_rounds(self) -> int:
        """Rounds one ctrlbench episode plays: --rounds, or baseline + steering + release."""
        return self.baseline_rounds + self.rounds + self.release_rounds if self.persistence else self.rounds

    @property
    def window_grid(self) -> tuple[int | None, ...]:
        """The persistence boxes' windows, smallest first, then None (the unbounded box)."""
        return (*sorted(self.windows), None)

    def dial_box(self, lam: float) -> str:
        from ctrlsim.recommenders.dial import format_lambda

        return ":".join([f"{self.observation.dial_kind}:{format_lambda(lam)}", *self.dial_options])

    def window_box(self, window: int | None) -> str:
        """A persistence box: `dial:1:window=W` (None: the unbounded `dial:1`) with the dial options,
        and a random base ranking unless they name a base (`PERSISTENCE_BASE`)."""
        options = list(self.dial_options)
        if not any(pair.partition("=")[0] == "base" for pair in options):
            options.insert(0, PERSISTENCE_BASE)
        head = [f"{self.observation.dial_kind}:1", *([f"window={window}"] if window is not None else [])]
        return ":".join([*head, *options])

    def dial_boxes(self) -> list[str]:
        """The reference boxes: one per lambda, or (persistence) one per window and the unbounded one."""
        if self.persistence:
            return [self.window_box(w) for w in self.window_grid]
        return [self.dial_box(lam) for lam in self.grid]

    def boxes(self) -> list[str]:
        return [*self.dial_boxes(), *self.compare]

    def units(self) -> list[CalibrationUnit]:
        """Every (method, box, seed) unit in a stable order (box, seed, method)."""
        return [CalibrationUnit(m, b, s) for b in self.boxes() for s in self.seeds for m in self.all_methods]

    def keys(self) -> list[str]:
        return [unit.key for unit in self.units()]


@dataclass(frozen=True)
class CalibrationUnit:
    """One unit of a calibration: the protocol's method on one box with one seed. Its record is
    stored under `key` (method|box|seed=N); the spec travels with the key to the unit."""

    method: str
    box: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.method}|{self.box}|seed={self.seed}"


def protocol_config(config: CalibrateConfig, method: str, box: str, seed: int):
    """The protocol runner's own config for one unit (validated as that runner validates it)."""
    return config.observation.config_for(config, method, box, seed)


# `--preset smoke`: the smallest real run of this runner (the smallest bundled LLM, a handful of
# units): what the runner contract test and a first try use.
SMOKE_PRESET: dict = {"methods": ("base-small",), "dials": (0.0, 1.0), "seeds": (0,), "targets": ("War",),
         "agents": (1, 1),
         "rounds": 1, "decision": "json", "llm": SMALLEST_LLM}
PRESETS = {"smoke": SMOKE_PRESET}
