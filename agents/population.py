"""Playing a `Population` (personas + policy) through a `PopulationEnv` episode, round by round.

Shared by the CtrlBench-Rec runner and the evolution loop's interaction phase. The trace keeps,
per probe, what the metrics need at every round t (likes per round, cumulative tokens), so
Coverage / Efficiency / Len / Tokens at t = 5, 10, 15, 20 and the coverage-vs-round curves
come from one episode.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

from ctrlsim.envs.phases import PhasePlan
from ctrlsim.envs.tasks import SOURCE_RECOMMENDER

from ctrlsim.backends import TokenMeter

from .llm_probe import DecisionSettings, LLMPopulationPolicy
from .methods import CustomPolicy, Population
from .random_probe import RandomProbe


@dataclass
class ProbeTrace:
    """One probe's episode: seed history, new likes per round, tokens after each round, fate.

    `rounds` keeps what each round was: `{"slate": [item ids], "source": "recommender" | "search",
    "liked": [item ids], "query": str, "reply": the raw LLM decision (None for other policies)}`,
    so a run folder shows where every like came from; in a steer-then-release episode each also
    has "phase" ("baseline", "steer", "release"). `likes_per_round` holds every like
    (search-found too: they shape the history); the metrics read `recommender_likes_per_round`.
    """

    probe_id: str
    agent: str
    seed_history: list[str]
    likes_per_round: list[list[str]] = field(default_factory=list)
    tokens_per_round: list[int] = field(default_factory=list)  # cumulative, after each round
    dropped: str | None = None
    dropped_round: int | None = None
    stats: dict = field(default_factory=dict)
    rounds: list[dict] = field(default_factory=list)

    @property
    def recommender_likes_per_round(self) -> list[list[str]]:
        """Per round, the likes on a recommender slate ([] for a search-result round)."""
        sources = [r["source"] for r in self.rounds]
        return [likes if n >= len(sources) or sources[n] == SOURCE_RECOMMENDER else []
                for n, likes in enumerate(self.likes_per_round)]

    @property
    def search_likes(self) -> list[str]:
        return [i for r in self.rounds if r["source"] != SOURCE_RECOMMENDER for i in r["liked"]]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class EpisodeTrace:
    rounds: int
    probes: list[ProbeTrace]

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "probes": [p.to_dict() for p in self.probes]}


def play_population(env, population: Population, *, seed: int, target: Sequence[str] = (), llm=None,
                    settings: DecisionSettings | None = None, like_prob: float = 0.3,
                    meter: TokenMeter | None = None,
                    on_round: Callable[[int, EpisodeTrace], None] | None = None,
                    intervene: Callable[[int, dict, dict], dict] | None = None) -> EpisodeTrace:
    """Reset `env` with the population's roster (seeded) and play until every probe is done.

    LLM populations decide with one batched `chat` per step; a probe whose LLM call fails with a
    probe failure (`ctrlsim.errors.PROBE_FAILURES`) is reported with `env.drop(agent, reason)`
    and an unparseable reply is a skipped round counted in the probe's `stats`. Any other error
    (the LLM server unavailable, `BackendUnavailableError`; a model that cannot load; a bug)
    propagates: the episode has no trace and its unit fails. `meter` gets each probe's tokens
    under its `probe_id` (pass the env's `token_meter` so the env's infos agree).

    Phases come with the env (`env.phases`, a `PhasePlan`): policies read each round's phase
    from the infos (LLM probes drop the goal outside "steer", the oracle plays its persona,
    random probes flip the same coins), and under release_mode "skip" every release round is
    played here as a skip (no like, no query) without asking the policy or the LLM.

    `intervene(round_no, actions, infos)`, where given, sees every round's actions before the env
    does and returns the actions played (a counterfactual arm adds its negative feedback there);
    a round's negative feedback, when any was given, is kept in its trace entry ("feedback").
    LLM probes are offered the buttons (`settings.negative_feedback`) only where `env` takes them:
    on an env made without `negative_feedback=True` (the evolution loop's interaction) they play
    like-only.
    """
    meter = meter if meter is not None else TokenMeter()
    settings = settings if settings is not None else DecisionSettings()
    if settings.negative_feedback and not env.engine.negative_feedback:
        settings = replace(settings, negative_feedback=False)
    specs = [p.to_probe_spec() for p in population.personas]
    obs, infos = env.reset(seed=seed, options={"roster": specs})
    agents = list(env.agents)
    by_agent = dict(zip(agents, population.personas))
    trace = EpisodeTrace(env.engine.budget, [ProbeTrace(p.probe_id, a, list(p.behaviour)) for a, p in
                                             by_agent.items()])
    per_agent = {t.agent: t for t in trace.probes}
    policy = None
    if population.policy == "llm":
        if llm is None:
            raise ValueError("an LLM population needs an llm")
        policy = LLMPopulationPolicy(llm, env.dataset, by_agent, target=target,
                                     settings=replace(settings, prompt_variant=population.prompt_variant),
                                     seed=seed, meter=meter)
    elif isinstance(population.policy, CustomPolicy):
        custom = population.policy.make(by_agent, {a: env.agent_rngs[a] for a in agents})
    else:
        custom = CustomPolicy.per_probe("random", lambda p, rng: RandomProbe(rng, like_prob)).make(
            by_agent, {a: env.agent_rngs[a] for a in agents})
    slate_size, budget = env.engine.slate_size, env.engine.budget
    item_ids = env.dataset.item_ids
    phases: PhasePlan | None = env.phases
    for round_no in range(1, budget + 1):
        live = list(env.agents)
        if not live:
            break
        if phases is not None and phases.skips(round_no):
            actions = {a: {"likes": [0] * slate_size, "query": ""} for a in live}
        elif policy is not None:
            actions, failed = policy.act({a: obs[a] for a in live}, {a: infos[a] for a in live},
                                         slate_size=slate_size, budget=budget)
            for agent, reason in failed.items():
                env.drop(agent, reason)
        else:
            actions = custom.act({a: obs[a] for a in live}, {a: infos[a] for a in live})
        if intervene is not None:
            actions = intervene(round_no, actions, {a: infos[a] for a in live})
        obs, _, terms, _, infos = env.step(actions)
        for agent in live:
            probe_trace = per_agent[agent]
            record = env.probes[agent].record
            if len(record.slates) > len(probe_trace.rounds):  # the probe acted this round
                entry = {
                    "slate": [str(item_ids[i]) for i in record.slates[-1]], "source": record.sources[-1],
                    "liked": list(record.likes_per_round[-1]), "query": record.queries[-1],
                    "reply": policy.reply(agent, round_no) if policy is not None else None}
                if phases is not None:
                    entry["phase"] = phases.phase_of(len(record.slates))
                given = record.feedback_per_round[-1] if record.feedback_per_round else None
                if given and any(given.values()):
                    entry["feedback"] = given
                probe_trace.rounds.append(entry)
            probe_trace.likes_per_round = [list(x) for x in record.likes_per_round]
            probe_trace.tokens_per_round.append(meter.usage(probe_trace.probe_id).total_tokens)
            if terms.get(agent) and probe_trace.dropped is None:
                probe_trace.dropped = infos[agent].get("failure", "terminated")
                probe_trace.dropped_round = round_no
        if on_round is not None:
            on_round(round_no, trace)
    if policy is not None:
        for agent, probe_trace in per_agent.items():
            probe_trace.stats = policy.probe_stats(agent)
    return trace
