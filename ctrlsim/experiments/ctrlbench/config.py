"""`ctrlsim ctrlbench`: CtrlBench-Rec's method comparison (Tables 1, 2 and 7, Figures 3, 8-11).

Methods x black boxes x targets x seeds: every (method, box, target, seed) is one episode (an
`Episode` spec), a pure function of config and spec -> record, stored in the run folder's
records.jsonl as it finishes. A killed run started again with the same command skips finished
episodes (and the run folder's LLM response cache replays the half-finished one for free). The run
folder then gets:

  config.json          the config and the software that ran it
  records.jsonl        one record per episode: per-round Task 1 curves and Efficiency counts, per-tag
                       finds, Task 2 / 3 curves, per-probe rounds (slate, source, likes, query, reply),
                       parse failures, dropped probes, substitutions, setup tokens, the LLM and box
  rosters/*.json       the evaluated personas of each (method, seed, box, target)
  tables.md            Table 1 and Table 7 per black box, the paired comparison with the reference
                       method, per-target (and per-tag) coverage, substitutions; Table 2 or Task 3
                       with --task; every cell with its 95% confidence interval
  figures/*.png        coverage vs round with 95% bands per box (Figures 10, 11); per-target bars

Only likes on recommender slates count (search is off unless --allow-search; search likes are
reported apart). A target is a tag or a '+' union of tags. Tables aggregate per black box and
are defined in `ctrlsim.experiments.ctrlbench.tables`.

`--roster file.json` evaluates a stored roster (a JSON list of Persona dicts, e.g. written by
`ctrlsim evolve`) as the method "roster"; `--methods module:attribute` imports a method from the
user's code (docs/ctrlbench.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrlsim.agents.llm_probe import DECISION_HEADS, DEFAULT_DECISION, DEFAULT_THRESHOLD
from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM, SMALLEST_LLM
from ctrlsim.envs.phases import AWAY, DIRECTIONS, RELEASE_BASELINE, RELEASE_MODES, TOWARD
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    DEFAULT_SUCCESS,
    MAX_AGENTS,
    MAX_ITEMS,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SLATE,
    check_choices,
    check_fields,
    check_range,
    option,
)

ROSTER_METHOD = "roster"  # the method name of a stored roster (--roster file.json)
DEFAULT_OUT = "results/ctrlbench"
# Slate sizes of the CtrlBench-Rec reference runs: 20 for NARM, 3 for the other boxes.
PAPER_SLATE_SIZE = {"narm": 20}
PAPER_CHECKPOINTS = (5, 10, 15, 20)

# The paper's code steers one population toward the union of six genres (Figure 3 splits it).
PAPER_UNION = "Action+Adventure+Thriller+War+Romance+Film-Noir"
# `--preset paper`: the paper's sizes (K = 100 / 26, t = 20, the six-genre union, five boxes),
# search off as Appendix B's evaluation (a_t in L_t or a skip).
PAPER_PRESET: dict[str, Any] = {
    "methods": ("base-large", "base-small", "kmeans-fusion", "ctrlbench", "random", "oracle"),
    "recommenders": ("twhin-bert", "bge", "narm", "sasrec", "keyword-bm25"),
    "targets": (PAPER_UNION,),
    "agents": (100, 26),
    "rounds": 20,
    "seeds": (0, 1, 2),
    "temperature": 1.0,
    "allow_search": False,
    "decision": "json",
}
TASK_CHOICES = ("target-discovery", "profile-shaping", "popularity", "persistence", "suppression",
                "responsiveness")
PERSISTENCE = "persistence"  # steer-then-release episodes (docs/persistence.md)
# Steering away: each (method, box, target, seed) plays the phases twice, away from the target from
# histories rich in it and toward it from ordinary ones, for the asymmetry (docs/persistence.md).
SUPPRESSION = "suppression"
PHASED_TASKS = (PERSISTENCE, SUPPRESSION)
# Counterfactual responsiveness: each episode forks at a round into a skip arm and one arm per
# negative-feedback action (docs/responsiveness.md).
RESPONSIVENESS = "responsiveness"
FEEDBACK_ACTIONS = ("not_interested", "dislike", "block")
SMALL_USERS = ("own", "nested")
CONVERSATIONS = ("memory", "append")
# `--preset smoke`: the smallest real run of this runner (the smallest bundled LLM, a handful of
# units): what the runner contract test and a first try use.
SMOKE_PRESET: dict = {"methods": ("base-small",), "recommenders": ("popularity",), "targets": ("War",),
         "agents": (1, 1),
         "rounds": 1, "seeds": (0, 1), "decision": "json", "llm": SMALLEST_LLM}
PRESETS = {"paper": PAPER_PRESET, "smoke": SMOKE_PRESET}





@dataclass(frozen=True)
class CtrlBenchConfig:
    """One CtrlBench-Rec comparison (what identifies its results)."""

    methods: tuple[str, ...] = option(
        ("base-large", "base-small", "kmeans-fusion", "ctrlbench", "random"),
        "methods to compare: base-large, base-small, kmeans-fusion, ctrlbench, ctrlbench-logic, random, "
        "oracle, rl:PATH (a probe trained by `ctrlsim train-probe`), or module:attribute (a method from "
        "your code, docs/ctrlbench.md)")
    recommenders: tuple[str, ...] = option(("embedding",), "black boxes (names of `ctrlsim.recommenders`, or "
                                           "recbole:<Model>)")
    targets: tuple[str, ...] = option(("War+Film-Noir",), "target sets: a tag, or tags joined by '+' into "
                                      f"one union target (paper: {PAPER_UNION})")
    llm: str = option(DEFAULT_PROBE_LLM, "the probes' LLM (a load_llm spec)")
    agents: tuple[int, ...] = option((8, 2), "K_large,K_small: probes of base-large and the evolution's "
                                     "start, and of base-small/random/oracle; K_small = the super probes "
                                     "left after the fusions for a fair comparison (paper: 100,26)", low=1,
                                     high=MAX_AGENTS)
    rounds: int = option(4, "interaction rounds t per episode (paper: 20)", low=1, high=MAX_ROUNDS)
    seeds: tuple[int, ...] = option((0, 1), "seeds (users sampled, sampling, env); two at least for a "
                                    "confidence interval", low=0, high=MAX_SEED)
    task: str = option("target-discovery", "which task's tables: target-discovery (Tables 1, 7), "
                       "profile-shaping (Table 2) or popularity (Figures 8, 9), which every episode records; "
                       "or persistence: steer-then-release episodes (baseline, --rounds of steering, "
                       "release) and whether control lasts; or suppression: the same phases steering away "
                       "from the target (histories rich in it) and toward it, and their asymmetry; or "
                       "responsiveness: each episode forks at --fork-round into a skip arm and one arm per "
                       "negative-feedback action, --rounds more rounds each (do the buttons work?)",
                       choices=TASK_CHOICES)
    fork_round: int = option(2, "(--task responsiveness) the round at which each probe dismisses one item "
                             "of its slate in the feedback arms (skips it in the skip arm)", low=1,
                             high=MAX_ROUNDS, omit_default=True)
    feedback_actions: tuple[str, ...] = option(FEEDBACK_ACTIONS, "(--task responsiveness) the negative-"
                                               "feedback actions compared with a skip: not_interested, "
                                               "dislike, block (the dismissed item's first tag)",
                                               omit_default=True)
    baseline_rounds: int = option(2, "(--task persistence, suppression) rounds before steering: probes "
                                  "without a goal",
                                  low=1, high=MAX_ROUNDS, omit_default=True)
    release_rounds: int | None = option(None, "(--task persistence, suppression) rounds after steering "
                                        "stops (default: --rounds)", low=1, high=MAX_ROUNDS,
                                        omit_default=True)
    release: str = option(RELEASE_BASELINE, "(--task persistence, suppression) what probes do after "
                          "steering: baseline (their goal-free policy) or skip (like nothing)",
                          choices=RELEASE_MODES, omit_default=True)
    allow_search: bool = option(False, "offer probes the search tool (search likes shape histories but "
                                "never count; paper's evaluation: off)")
    negative_feedback: bool = option(False, "offer LLM probes (--decision json) the 'not interested' "
                                     "button: a reply may mark slate items, which the box then sees "
                                     "(docs/responsiveness.md)", omit_default=True)
    reference: str | None = option(None, "the method every other is compared with in the paired table "
                                   "(default: base-small when it runs, else the first method)")
    success_threshold: float = option(DEFAULT_SUCCESS, "Coverage share at the last round at or above which "
                                      "an episode succeeds, for pass^k (a share in [0, 1]; changes tables, "
                                      "not records)", low=0.0, high=1.0, omit_default=True)
    small_users: str = option("own", "K_small methods' users: their own random sample, or nested = the first "
                              "K_small of Base-Large's (then Base-Large >= Base-Small by construction)",
                              choices=SMALL_USERS)
    dataset: str = option("ml-100k", "dataset name or path")
    slate_size: int | None = option(None, "items per slate (default: the paper's, 20 for narm and 3 for the "
                                    "other boxes)", low=1, high=MAX_SLATE)
    checkpoints: tuple[int, ...] | None = option(None, "rounds reported in Table 1 (default: 5,10,15,20 up "
                                                 "to --rounds, else quarters of it)")
    memory_rounds: int = option(2, "M, rounds of short-term memory in the prompt (the shared evaluation "
                                "setting)", low=0, high=MAX_ROUNDS)
    target_visible: bool = option(True, "show the target tags to the probes")
    conversation: str = option("memory", "probe prompts: memory (last M rounds summarised, the paper's) or "
                               "append (a growing conversation; fast with KV reuse, docs/ctrlbench.md)",
                               choices=CONVERSATIONS, omit_default=True)
    decision: str = option(DEFAULT_DECISION, "how LLM probes decide: json (one generated {\"like\": [...]} "
                           "reply, the paper's), yesno (one yes/no question per item, P(yes) from the "
                           "next-token probabilities) or twostep (fits the persona? one of the goal's items? "
                           "both must pass); docs/probe-validity.md", choices=DECISION_HEADS)
    decision_threshold: float = option(DEFAULT_THRESHOLD, "P(yes) at or above which a question head "
                                       "(yesno, twostep) likes an item, in (0, 1)")
    temperature: float = option(0.0, "probe and profile sampling temperature; 0 = greedy, batched as "
                                "parallel sequences on llama.cpp (paper: 1.0)", low=0.0, high=2.0)
    l_init: tuple[int, ...] = option((4, 6), "seed history length range L_init", low=1, high=MAX_ITEMS)
    like_prob: float = option(0.3, "the random method's like probability", low=0.0, high=1.0)
    min_target_items: int = option(5, "smallest target set accepted (coverage over fewer items moves in "
                                   "steps of 20%%+)", low=1, high=MAX_ITEMS)
    recommender_llm: str | None = option(None, "LLM inside LLM-based boxes such as keyword-bm25 (default: "
                                         "the box's own)")
    roster: str | None = option(None, "a JSON file of Persona dicts evaluated as the method 'roster'")
    cache: bool = option(True, "keep LLM replies and personas in the run's response cache (the run folder, "
                         "and --shared-cache where given; replays are free)")
    method_options: dict[str, dict] = option(help="per-method options, method name -> dict (config only, "
                                             "no flag)", default_factory=dict)

    def __post_init__(self):
        from ctrlsim.agents.methods import known_methods

        if ROSTER_METHOD in self.methods and self.roster is None:
            raise ConfigError("method 'roster' needs --roster <file.json>")
        methods = [m for m in self.methods if m != ROSTER_METHOD]
        custom = [m for m in methods if ":" in m]
        check_choices("methods", [m for m in methods if ":" not in m], known_methods(),
                      allow_empty=self.roster is not None or bool(custom))
        for name in custom:  # imported now: an unimportable one fails before any model loads
            from ctrlsim.agents.methods import get_method
            from ctrlsim.agents.rl import check_rl_method, is_rl_method

            get_method(name)
            if is_rl_method(name):  # a saved policy sees slates of the size it was trained on
                for size in sorted({self.slate_for(box) for box in self.recommenders}):
                    check_rl_method(name, slate_size=size, allow_search=self.allow_search)
        if len(self.agents) != 2 or self.agents[1] > self.agents[0]:
            raise ConfigError(f"agents must be K_large,K_small with K_small <= K_large, got {self.agents}")
        if len(self.l_init) != 2 or not 1 <= self.l_init[0] <= self.l_init[1]:
            raise ConfigError(f"l_init must be low,high with 1 <= low <= high, got {self.l_init}")
        check_fields(self)
        from ctrlsim.agents.llm_probe import check_decision

        # A bad head, threshold or combination fails now, before any model loads.
        check_decision(self.decision, self.decision_threshold, allow_search=self.allow_search,
                       conversation=self.conversation, negative_feedback=self.negative_feedback)
        if self.negative_feedback and self.task == RESPONSIVENESS:
            raise ConfigError("--negative-feedback lets probes press the buttons themselves; --task "
                              "responsiveness presses them by script, in one arm per action, so that the "
                              "arms differ by that press alone: use one or the other")
        if self.reference is not None and self.reference not in self.all_methods:
            raise ConfigError(f"reference {self.reference!r} is not among the methods "
                              f"{list(self.all_methods)}")
        from ctrlsim.recommenders.registry import check_recommender_name

        for box in self.recommenders:
            try:
                check_recommender_name(box)
            except ConfigError as exc:
                raise ConfigError(f"recommenders: {exc}") from None
        check_choices("recommenders", self.recommenders, self.recommenders)  # no box twice
        if not self.recommenders:
            raise ConfigError("recommenders needs at least one black box")
        if not self.targets:
            raise ConfigError("targets needs at least one tag")
        for name, values in (("targets", self.targets), ("recommenders", self.recommenders),
                             ("methods", self.methods)):
            bad = [v for v in values if "|" in v or not v.strip()
                   or (name == "targets" and any(not tag.strip() for tag in v.split("+")))]
            if bad:
                raise ConfigError(f"{name}: {bad[0]!r} is empty or contains '|'")
        for target in self.targets:
            tags = target.split("+")
            if len(set(tags)) != len(tags):
                raise ConfigError(f"targets: {target!r} names a tag more than once")
        repeated = sorted({t for t in self.targets if self.targets.count(t) > 1})
        if repeated:
            raise ConfigError(f"targets: given more than once: {repeated}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")
        for t in self.checkpoints or ():
            check_range("checkpoints", t, low=1, high=self.rounds)
        if self.task not in PHASED_TASKS and (self.baseline_rounds != 2 or self.release_rounds is not None
                                              or self.release != RELEASE_BASELINE):
            raise ConfigError("baseline_rounds, release_rounds and release belong to --task persistence or "
                              f"suppression (the task is {self.task!r})")
        if self.task != RESPONSIVENESS and (self.fork_round != 2
                                            or self.feedback_actions != FEEDBACK_ACTIONS):
            raise ConfigError("fork_round and feedback_actions belong to --task responsiveness "
                              f"(the task is {self.task!r})")
        check_choices("feedback_actions", self.feedback_actions, FEEDBACK_ACTIONS)
        if self.roster is not None and not Path(self.roster).is_file():
            raise ConfigError(f"--roster {self.roster!r}: no such file")

    # ------------------------------------------------------------------ derived
    @property
    def all_methods(self) -> tuple[str, ...]:
        """The methods evaluated: the named ones, plus 'roster' when a roster file is given."""
        if self.roster is not None and ROSTER_METHOD not in self.methods:
            return (*self.methods, ROSTER_METHOD)
        return self.methods

    @property
    def reference_method(self) -> str:
        if self.reference is not None:
            return self.reference
        return "base-small" if "base-small" in self.all_methods else self.all_methods[0]

    def decision_settings(self):
        """How this run's LLM probes decide (`ctrlsim.agents.llm_probe.DecisionSettings`)."""
        from ctrlsim.agents.llm_probe import DecisionSettings

        return DecisionSettings(memory_rounds=self.memory_rounds, target_visible=self.target_visible,
                                temperature=self.temperature, allow_search=self.allow_search,
                                conversation=self.conversation, decision=self.decision,
                                threshold=self.decision_threshold, negative_feedback=self.negative_feedback)

    def phase_plan(self, direction: str = TOWARD):
        """The steer-then-release plan of a persistence or suppression run, steering `direction`
        (`ctrlsim.envs.PhasePlan`), else None."""
        if self.task not in PHASED_TASKS:
            return None
        from ctrlsim.envs.phases import PhasePlan

        return PhasePlan(self.baseline_rounds, self.rounds, self.release_rounds or self.rounds, self.release,
                         direction)

    @property
    def episode_rounds(self) -> int:
        """Rounds of one episode: --rounds, baseline + steering + release with a phased task, or the
        fork round + --rounds with --task responsiveness."""
        if self.task == RESPONSIVENESS:
            return self.fork_round + self.rounds
        plan = self.phase_plan()
        return self.rounds if plan is None else plan.total

    def slate_for(self, box: str) -> int:
        return self.slate_size or PAPER_SLATE_SIZE.get(box, 3)

    def report_rounds(self) -> tuple[int, ...]:
        if self.checkpoints:
            return tuple(sorted(set(self.checkpoints)))
        paper = tuple(t for t in PAPER_CHECKPOINTS if t <= self.rounds)
        if self.rounds >= PAPER_CHECKPOINTS[-1]:
            return paper
        return tuple(sorted({max(1, round(self.rounds * q / 4)) for q in (1, 2, 3, 4)}))

    def episodes(self) -> list[Episode]:
        """Every episode in a stable order (box, target, seed, method; with --task suppression, then
        direction: toward, away)."""
        directions: tuple[str | None, ...] = DIRECTIONS if self.task == SUPPRESSION else (None,)
        return [Episode(m, b, t, s, d) for b in self.recommenders for t in self.targets for s in self.seeds
                for m in self.all_methods for d in directions]

    def keys(self) -> list[str]:
        """Episode keys in a stable order: method|box|target|seed=N."""
        return [episode.key for episode in self.episodes()]


@dataclass(frozen=True)
class Episode:
    """One unit of a ctrlbench run: a (method, box, target, seed) episode, and with --task suppression
    the direction its steering pushes ("toward" or "away"). Its record is stored under `key`; the
    spec travels with the key to the unit, which never parses the key back."""

    method: str
    box: str
    target: str
    seed: int
    direction: str | None = None

    @property
    def key(self) -> str:
        return episode_key(self.method, self.box, self.target, self.seed, self.direction)

    @property
    def steers_away(self) -> bool:
        return self.direction == AWAY


def episode_key(method: str, box: str, target: str, seed: int, direction: str | None = None) -> str:
    """method|box|target|seed=N, and |toward or |away for a suppression run's episode."""
    key = f"{method}|{box}|{target}|seed={seed}"
    return key if direction is None else f"{key}|{direction}"


def parse_key(key: str) -> tuple[str, str, str, int]:
    try:
        method, box, target, seed, *direction = key.split("|")
        if len(direction) > 1 or (direction and direction[0] not in DIRECTIONS):
            raise ValueError(key)
        return method, box, target, int(seed.removeprefix("seed="))
    except ValueError:
        raise ConfigError(f"not a ctrlbench episode key: {key!r} (expected method|box|target|seed=N, "
                          "then |toward or |away in a suppression run)") from None
