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

    def __post_init__(self):
        from ctrlsim.recommenders.dial import check_lambda, format_lambda

        check_fields(self)
        from ctrlsim.agents.llm_probe import check_decision

        check_decision(self.decision, self.decision_threshold)  # before any model loads
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
        protocol_config(self, self.all_methods[0], self.dial_box(grid[0]), self.seeds[0])
        self.check_boxes()

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

        for lam in self.grid:
            check_dial_spec(self.dial_box(lam))
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
    def all_methods(self) -> tuple[str, ...]:
        return self.methods or self.observation.default_methods

    @property
    def grid(self) -> tuple[float, ...]:
        return tuple(sorted(float(v) for v in self.dials))

    @property
    def metrics(self) -> tuple[str, ...]:
        return self.observation.metrics

    def dial_box(self, lam: float) -> str:
        from ctrlsim.recommenders.dial import format_lambda

        return ":".join([f"{self.observation.dial_kind}:{format_lambda(lam)}", *self.dial_options])

    def boxes(self) -> list[str]:
        return [*(self.dial_box(lam) for lam in self.grid), *self.compare]

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
