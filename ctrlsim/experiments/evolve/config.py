"""`ctrlsim evolve`: CtrlBench-Rec's evolutionary training loop, then t evaluation rounds.

    K_init LLM persona probes -> [interact E_i rounds, embed, cluster, debate, merge] x E_m
    -> align -> evaluate the super probes for t rounds (Task 1 metrics per round)

Paper schedule (Appendix C): --agents 100 --merges 2 --rounds-per-merge 2 --eval-rounds 20
(100 -> 50 -> 25 probes). The run folder holds config.json, records.jsonl (one record per
finished phase and the evaluation), the loop's artefacts (roster_g*.json, clusters_g*.json,
transcript_g*.json, merge_g*.json, phases.json with wall time and tokens per phase),
final_roster.json, tables.md and figures/*.png. Rerunning the same command resumes at the
first unfinished phase; LLM replies are cached in the folder (llm-cache.sqlite), so nothing
is paid twice. With --executor ray each cluster's debate and merge is one unit of work on the
cluster's workers (the driver runs the other phases and writes every artefact). Evaluate the
result on any black box with
`ctrlsim ctrlbench --roster <out>/final_roster.json`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctrlsim.agents.llm_probe import DECISION_HEADS, DEFAULT_DECISION, DEFAULT_THRESHOLD
from ctrlsim.backends.bundled import DEFAULT_PROBE_LLM, SMALLEST_LLM
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import (
    MAX_AGENTS,
    MAX_ITEMS,
    MAX_MERGES,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SLATE,
    MAX_TOKENS,
    check_choices,
    check_fields,
    option,
)

DEFAULT_OUT = "results/evolve"
K_RULES = ("halve", "silhouette")
FUSIONS = ("debate-merge", "select-best")
PROMPT_VARIANTS = ("default", "logic")
CONVERSATIONS = ("memory", "append")
# Tuple fields whose new values extend a run folder (the loop's identity leaves them out).
EXTENSIBLE = ("levels",)


@dataclass(frozen=True)
class EvolveConfig:
    """One evolution run (everything that determines its results)."""

    agents: int = option(100, "K_init, probes in the first generation (paper: 100)", low=1, high=MAX_AGENTS)
    merges: int = option(2, "E_m, cluster-debate-merge fusions (paper: 2)", low=1, high=MAX_MERGES)
    rounds_per_merge: int = option(2, "E_i, interaction rounds before each fusion", low=1, high=MAX_ROUNDS)
    eval_rounds: int = option(20, "t, evaluation rounds of the super probes (0: none)", low=0,
                              high=MAX_ROUNDS)
    llm: str = option(DEFAULT_PROBE_LLM, "LLM of probes, debate and merge (load_llm spec)")
    encoder: str = option("minilm", "encoder of the embed phase (load_encoder spec)")
    recommender: str = option("embedding", "the black box (ctrlsim.recommenders name)")
    target: tuple[str, ...] = option(("Film-Noir",), "target tag(s), comma-separated")
    dataset: str = option("ml-100k", "dataset name or path")
    seed: int = option(0, "seed (users sampled, K-means, sampling, envs)", low=0, high=MAX_SEED)
    k_rule: str = option("halve", "k per generation: ceil(N/2), or best silhouette in [N/2, 3N/4]",
                         choices=K_RULES)
    alpha: float = option(0.2, "bio weight in V = a*enc(bio) + (1-a)*mean(enc(likes))", low=0.0, high=1.0)
    fusion: str = option("debate-merge", "debate-merge (CtrlBench-Rec) or select-best (KMeans-Fusion)",
                         choices=FUSIONS)
    slate_size: int | None = option(None, "items per slate (default: 20 for narm, else 3, as in the paper)",
                                    low=1, high=MAX_SLATE)
    temperature: float = option(
        0.7, "sampling temperature of the loop's decisions, debates and merges (seeded; paper: 1.0)",
        low=0.0, high=2.0)
    memory_rounds: int = option(3, "M, rounds of short-term memory in the loop's decisions", low=0,
                                high=MAX_ROUNDS)
    conversation: str = option("memory", "probe prompts in the loop's rounds: memory (the paper's) or "
                               "append (a growing conversation, fast with KV reuse)", choices=CONVERSATIONS,
                               omit_default=True)
    eval_conversation: str = option("memory", "probe prompts in the evaluation rounds", choices=CONVERSATIONS,
                                    omit_default=True)
    decision: str = option(DEFAULT_DECISION, "how LLM probes decide, in the loop and the evaluation "
                           "(docs/probe-validity.md)", choices=DECISION_HEADS)
    decision_threshold: float = option(DEFAULT_THRESHOLD, "P(yes) at or above which a question head likes "
                                       "an item, in (0, 1)")
    eval_temperature: float = option(0.0, "decision temperature of the evaluation rounds (the setting "
                                     "`ctrlsim ctrlbench` scores every method and roster with)", low=0.0,
                                     high=2.0)
    eval_memory_rounds: int = option(2, "M in the evaluation rounds (ctrlbench's evaluation setting)", low=0,
                                     high=MAX_ROUNDS)
    allow_search: bool = option(False, "offer probes the search tool (search likes never count; the "
                                "paper's evaluation: off)")
    target_visible: bool = option(True, "show the target tags to the probes")
    prompt_variant: str = option("default", "decision prompt in evaluation: default, or logic (long-tail, "
                                 "Appendix D.8)", choices=PROMPT_VARIANTS)
    l_init: tuple[int, ...] = option((4, 6), "seed history length range L_init", low=1, high=MAX_ITEMS)
    debate_max_tokens: int = option(160, "reply budget of one debate turn", low=1, high=MAX_TOKENS)
    merge_max_tokens: int = option(384, "reply budget of one merge (JSON profile)", low=1, high=MAX_TOKENS)
    align_min_behaviour: int = option(4, "alignment fills shorter super-probe histories by catalogue search",
                                      low=0, high=MAX_ITEMS)
    levels: tuple[str, ...] = option((), "Task 2 level presets to run with the super probes for "
                                     "eval-rounds rounds (level-1,level-2,level-3: Table 6; Table 2 and "
                                     "Figure 7 come out)")

    def __post_init__(self):
        if len(self.l_init) != 2 or not 1 <= self.l_init[0] <= self.l_init[1]:
            raise ConfigError(f"l_init must be low,high with 1 <= low <= high, got {self.l_init}")
        check_fields(self)
        from ctrlsim.agents.evolution.levels import LEVELS

        check_choices("levels", self.levels, LEVELS, allow_empty=True)
        if self.levels and self.eval_rounds < 1:
            raise ConfigError("levels need eval-rounds >= 1")
        from ctrlsim.agents.llm_probe import check_decision  # a bad head fails before any model loads

        for conversation in (self.conversation, self.eval_conversation):
            check_decision(self.decision, self.decision_threshold, allow_search=self.allow_search,
                           conversation=conversation)
        if not self.target or any(not t.strip() for t in self.target):
            raise ConfigError(f"target needs at least one non-empty tag, got {self.target!r}")
        if len(set(self.target)) != len(self.target):
            raise ConfigError(f"target: a tag is given more than once in {list(self.target)}")
        from ctrlsim.recommenders.registry import check_recommender_name

        try:
            check_recommender_name(self.recommender)
        except ConfigError as exc:
            raise ConfigError(f"recommender: {exc}") from None

    @property
    def slate(self) -> int:
        return self.slate_size or (20 if self.recommender == "narm" else 3)

    def schedule(self) -> list[int]:
        """Expected population per generation with the halving rule: K, ceil(K/2), ..."""
        sizes = [self.agents]
        for _ in range(self.merges):
            sizes.append(-(-sizes[-1] // 2))
        return sizes


# `--preset smoke`: the smallest real run of this runner (the smallest bundled LLM, a handful of
# units): what the runner contract test and a first try use.
SMOKE_PRESET: dict = {"agents": 2, "merges": 1, "rounds_per_merge": 1, "eval_rounds": 1,
         "recommender": "popularity",
         "debate_max_tokens": 16, "merge_max_tokens": 64, "llm": SMALLEST_LLM}
PRESETS = {"smoke": SMOKE_PRESET}
