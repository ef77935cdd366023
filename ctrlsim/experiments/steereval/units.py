"""SteerEval's units of work: the dataset preparation, the scenario plan and the unit function.

The protocol itself is `ctrlsim.recommenders.steereval` (scenarios, conditions, the engine); the
runner plans units from these (`SteerEvalEpisode` specs), and every executor runs `run_steereval_unit`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctrlsim.errors import ConfigError
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.runner import RunContext
from ctrlsim.experiments.steereval.config import SteerEvalConfig, open_choices
from ctrlsim.recommenders.steereval import (  # noqa: F401 - the conditions are the runner's too
    CONDITIONS,
    LLM_WRITTEN,
    NON_TAGS,
    PAPER_CONDITIONS,
    Condition,
    choose_scenarios,
)

# ----------------------------------------------------------------------------- preparation

def prepare_dataset(config: SteerEvalConfig, unit: UnitContext | None = None):
    """The dataset with the config's side tables, the tags to steer, their template phrases and the
    items scenarios may use. Cheap (no model): every value is checked before any model loads."""
    from ctrlsim.agents.steering import trigger_phrase
    from ctrlsim.data import attach_descriptions, attach_tag_votes

    ds = (unit or UnitContext()).dataset(config.dataset)  # the side tables below make copies
    if config.descriptions:
        ds = attach_descriptions(ds, config.descriptions, links=config.links)
    if config.trigger_votes:
        ds = attach_tag_votes(ds, config.trigger_votes, threshold=config.vote_threshold, links=config.links)
    tags = list(config.tags) or [t for t in ds.tags if t not in NON_TAGS]
    unknown = [t for t in tags if t not in set(ds.tags)]
    if unknown:
        raise ConfigError(f"tags: unknown tag(s) {', '.join(map(repr, unknown))} for dataset {ds.name!r}; "
                          f"known: {', '.join(ds.tags)}")
    kinds = ds.item_tags.drop_duplicates("tag").set_index("tag")["kind"]
    rename = config.rename_triggers
    phrases = {t: trigger_phrase(t) if rename and kinds.get(t) == "trigger" else t for t in tags}
    items = None
    if config.descriptions and config.drop_undescribed:
        described = ds.items["description"].fillna("").astype(str).str.strip() != ""
        items = frozenset(ds.items.loc[described, "item_id"])
    return ds, tags, phrases, items


def scenarios_for(config: SteerEvalConfig, data: tuple):
    """(scenarios in unit order, tags short of users) for the config (no model loads)."""
    engine = make_env(config, data, Condition(), config.llm).engine
    return choose_scenarios(engine, data[1], config.users, config.seed)


def make_env(config: SteerEvalConfig, data: tuple, cond: Condition, model):
    """The SteerEval env of one condition over `data` (what `prepare_dataset` returns)."""
    from ctrlsim.envs.steereval_env import SteerEvalEnv

    ds, tags, phrases, items = data
    return SteerEvalEnv(dataset=ds, llm=model, ranker=cond.ranker, encoder=config.encoder,
                        profile_style=cond.profile_style, rating=config.rating, oracle=cond.oracle,
                        show_tags=cond.show_tags, tags=tags, tag_phrases=phrases, items=items,
                        pool_size=config.pool_size, history_len=config.history_len,
                        min_ratings=config.min_ratings, k=config.k, tie_seed=config.seed)


def measure_unit(env, policy, model, cond_name: str, sc, owners: dict[tuple, str], identity) -> dict:
    """Run one (condition, scenario) episode in `env` and return its record.

    Work shared by several units (profile, original ranking, the LLM-append sentence) counts
    towards the first unit that needs it in the full order (`owners`), so the token totals do not
    depend on where an earlier run was interrupted (a resume replays it from cache).
    """
    from ctrlsim.envs.steereval_env import to_observation_text

    cond = CONDITIONS[cond_name]
    key = record_key(cond_name, sc)
    meter = model.meter
    marks = [meter.total]
    env.engine.original_profile(sc)
    marks.append(meter.total)
    env.engine.original_ranking(sc)
    marks.append(meter.total)
    obs, info = env.reset(options={"scenario": sc})
    steered = to_observation_text(policy.act(obs, info))
    marks.append(meter.total)
    _, reward, _, _, figures = env.step(steered)
    marks.append(meter.total)
    shared = [owners[("profile", cond.env_key, sc.user_id)] == key,
              owners[("ranking", cond.env_key, sc.user_id, sc.tag)] == key,
              cond.intervention != "llm-append"
              or owners[("append", sc.tag, sc.direction)] == key, True]
    counted = [(b.prompt_tokens - a.prompt_tokens, b.completion_tokens - a.completion_tokens)
               for a, b, keep in zip(marks, marks[1:], shared) if keep]
    unknown = sum(b.unknown_calls - a.unknown_calls for a, b, keep in zip(marks, marks[1:], shared) if keep)
    record = {"condition": cond_name, "tag": sc.tag, "tag_kind": sc.tag_kind,
              "direction": sc.direction, "user": sc.user_id, "reward": reward,
              "llm": identity, **figures,
              "tokens": {"prompt": sum(p for p, _ in counted),
                         "completion": sum(c for _, c in counted)}}
    if unknown:  # calls whose server sent no token counts: the sums above are lower bounds
        record["tokens"]["unknown_calls"] = unknown
    if cond.intervention in LLM_WRITTEN:
        record["original_profile"] = info["original_profile"]
    else:
        record.pop("steered_profile")
    return record


@dataclass(frozen=True)
class SteerEvalEpisode:
    """One unit of a SteerEval run: one condition on one scenario. Stored under `key`
    (condition/user/tag/direction); the spec travels with the key to the unit."""

    condition: str
    scenario: Any  # ctrlsim.recommenders.steereval.Scenario

    @property
    def key(self) -> str:
        return record_key(self.condition, self.scenario)


def planned_scenarios(config: SteerEvalConfig, unit: UnitContext) -> tuple[tuple, list, dict]:
    """(data, scenarios, tags short of users) for the config, built once per process: the driver's
    up-front check and the units of a local run share one dataset and one scenario draw (both are
    pure functions of the config), so a run parses its dataset once, not once per use."""
    def build() -> tuple[tuple, list, dict]:
        data = prepare_dataset(config, unit)
        scenarios, short = scenarios_for(config, data)
        return data, scenarios, short

    return unit.once(f"steereval-scenarios:{config!r}", build)


def episodes(config: SteerEvalConfig, scenarios) -> list[SteerEvalEpisode]:
    """Every unit of the run, in the order of the plan (scenario by scenario, each condition)."""
    return [SteerEvalEpisode(cond, sc) for sc in scenarios for cond in config.conditions]


def _unit_plan(config: SteerEvalConfig, unit: UnitContext) -> tuple[tuple, dict[tuple, str]]:
    """(data, shared-work owners), rebuilt on a worker exactly as the driver plans them."""
    data, scenarios, _ = planned_scenarios(config, unit)
    return data, shared_work_owners([(e.condition, e.scenario) for e in episodes(config, scenarios)])


def run_steereval_unit(config: SteerEvalConfig, unit: UnitContext) -> dict:
    """One `SteerEvalEpisode` -> its record, on any worker.

    A fresh env and policy per unit: shared work memoised by an earlier unit on this worker would
    otherwise cost this unit 0 tokens. Each unit measures all of its shared work (from the response
    cache when another unit already paid for it) and keeps the parts it owns, as the local loop does.
    """
    episode: SteerEvalEpisode = unit.spec
    data, owners = unit.once(f"steereval-plan:{config!r}", lambda: _unit_plan(config, unit))
    cond = CONDITIONS[episode.condition]
    model = unit.llm(config.llm)
    policy = intervention_policy(cond, model)
    env = make_env(config, data, cond, model)
    return measure_unit(env, policy, model, episode.condition, episode.scenario, owners, model.identity)



def intervention_policy(cond: Condition, model):
    """The edit policy of a condition: an LLM-written append or rewrite (with `model`), else a template."""
    from ctrlsim.agents.steering import LLMAppend, LLMRewrite, TemplateAppend

    policies = {"llm-append": LLMAppend, "llm-rewrite": LLMRewrite}
    if cond.intervention in policies:
        return policies[cond.intervention](model)
    return TemplateAppend(cond.emphasis)


def shared_work_owners(units: list[tuple[str, Any]]) -> dict[tuple, str]:
    """The unit (record key) that pays for each piece of shared work: the first in `units` needing it."""
    owners: dict[tuple, str] = {}
    for cond_name, sc in units:
        cond, key = CONDITIONS[cond_name], record_key(cond_name, sc)
        owners.setdefault(("profile", cond.env_key, sc.user_id), key)
        owners.setdefault(("ranking", cond.env_key, sc.user_id, sc.tag), key)
        if cond.intervention == "llm-append":
            owners.setdefault(("append", sc.tag, sc.direction), key)
    return owners


def record_key(condition: str, sc) -> str:
    return f"{condition}/{sc.user_id}/{sc.tag}/{sc.direction}"


# ----------------------------------------------------------------------------- driver hooks

def check(ctx: RunContext) -> None:
    """Dataset, tags and scenarios, before any model loads (the scenarios need no model)."""
    config = ctx.config
    if ctx.given_llm(config.llm) is not None and ctx.options.executor != "local":
        raise ConfigError(f"a loaded llm can only be used with --executor local, got "
                          f"{ctx.options.executor!r}: ray workers load config.llm themselves")
    data, scenarios, short = planned_scenarios(config, ctx.unit)
    if not scenarios:
        raise ConfigError(f"no feasible scenario: no user meets the pool quotas at "
                          f"pool_size={config.pool_size} for tags {data[1]}")
    ctx.state.update(scenarios=scenarios, short=short, choices=open_choices(config))
    if ctx.given_llm(config.llm) is None:  # replies live in the run folder; a bundled LLM in $CTRLSIM_CACHE
        from ctrlsim.backends.bundled import check_cache_writable
        from ctrlsim.backends.spec_check import llm_cache_uses

        check_cache_writable(llm_cache_uses(config.llm))


def prepare(ctx: RunContext) -> None:
    assert ctx.folder is not None
    choices = ctx.state["choices"]
    ctx.folder.write_json("choices.json", choices)
    if ctx.show_progress:
        print("SteerEval choices the paper leaves open:")
        for key, value in choices.items():
            print(f"  {key}: {value}")


def plan(ctx: RunContext, finished) -> list[SteerEvalEpisode]:
    return episodes(ctx.config, ctx.state["scenarios"])


DECISION = "one profile edit, scored on the candidate pool (one scenario)"


def decisions(config, key: str, record: dict) -> int:
    return 1
