"""What a ctrlbench run reads besides its config: target sets (a tag or a '+' union of tags),
stored rosters, the population each method builds, the box and LLM of an episode (through the
unit context: one copy per worker), and the data checks that run before any model loads."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ctrlsim.errors import ConfigError, DataError, DataFileError
from ctrlsim.experiments.config import config_from_dict, config_to_dict
from ctrlsim.experiments.context import UnitContext
from ctrlsim.experiments.ctrlbench.config import ROSTER_METHOD, CtrlBenchConfig


def target_tags(target: str) -> tuple[str, ...]:
    """The tags of a target: "War" -> ("War",), "War+Film-Noir" -> ("War", "Film-Noir")."""
    return tuple(target.split("+"))


def target_items(dataset, target: str) -> frozenset[str]:
    """Every item carrying at least one of the target's tags (the union of a '+' target)."""
    return frozenset(i for tag in target_tags(target) for i in dataset.items_with_tag(tag))


def load_roster(path: str | Path) -> list:
    """Personas from a JSON file: a list of Persona dicts (or {"personas": [...]})."""
    from ctrlsim.agents.persona import Persona

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFileError(path, f"is not a readable JSON roster ({exc})") from None
    if isinstance(data, dict):
        data = data.get("personas", data.get("roster"))
    if not isinstance(data, list) or not data:
        raise DataFileError(path, "expected a non-empty JSON list of persona objects")
    personas = []
    for n, entry in enumerate(data):
        if not isinstance(entry, dict) or not {"probe_id", "name", "bio"} <= set(entry):
            raise DataFileError(path, f"entry {n} is not a persona (needs probe_id, name, bio)")
        try:
            personas.append(Persona.from_dict(entry))
        except (TypeError, ValueError) as exc:
            raise DataFileError(path, f"entry {n}: {exc}") from None
    return personas


def roster_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def check_targets(config, dataset) -> dict[str, int]:
    """Each target tag exists and is big enough; returns tag -> number of target items."""
    from ctrlsim.envs.roster import user_order

    sizes = {}
    for target in config.targets:
        for tag in target_tags(target):
            if tag not in dataset.tags:
                raise ConfigError(f"unknown target tag {tag!r} in {target!r} for dataset {dataset.name!r}; "
                                  f"known tags: {', '.join(dataset.tags)}")
        sizes[target] = len(target_items(dataset, target))
        if sizes[target] < config.min_target_items:
            raise ConfigError(f"target {target!r} has only {sizes[target]} items in {dataset.name!r}; this "
                              f"run needs at least --min-target-items={config.min_target_items}")
    users = len(user_order(dataset))
    if config.agents[0] > users:
        raise ConfigError(f"agents: K_large={config.agents[0]} exceeds the {users} users of {dataset.name!r}")
    if config.roster is not None:
        for persona in load_roster(config.roster):
            try:
                dataset.check_items(persona.behaviour)
            except DataError as exc:
                raise DataFileError(config.roster, f"persona {persona.probe_id!r}: {exc}") from None
    return sizes


def cache_uses(config) -> dict[str, str]:
    """What this run keeps under $CTRLSIM_CACHE (subfolder -> what), for the up-front check: the
    evolved methods' artefacts, a bundled LLM, and the boxes' own needs (replies and personas live
    in the run folder). Token-free methods on boxes without an LLM or weights need nothing there."""
    from ctrlsim.agents.methods import get_method
    from ctrlsim.backends.spec_check import llm_cache_uses
    from ctrlsim.recommenders.registry import cache_uses as box_cache_uses

    llm_methods = [m for m in config.all_methods if m == ROSTER_METHOD or get_method(m).uses_llm]
    evolved = [m for m in llm_methods if m != ROSTER_METHOD and getattr(
        get_method(m).build, "__module__", "").endswith("agents.evolution.methods")]
    uses: dict[str, str] = {}
    if llm_methods:
        uses.update(llm_cache_uses(config.llm))
        if evolved:
            uses["ctrlbench"] = f"the evolution artefacts of {', '.join(evolved)}"
    for box in config.recommenders:
        for part, what in box_cache_uses(box, llm=config.recommender_llm if box == "keyword-bm25"
                                         else None).items():
            uses.setdefault(part, what)
    return uses


def method_population(method: str, roster: str | None, context):
    """The probes of `method` (a registered method, or the stored roster at `roster`)."""
    from ctrlsim.agents.methods import Population, get_method

    if method == ROSTER_METHOD:
        assert roster is not None  # checked in CtrlBenchConfig.__post_init__
        artefacts = {"roster_file": str(roster), "roster_sha256": roster_digest(roster)}
        return Population(tuple(load_roster(roster)), "llm", artefacts=artefacts)
    return get_method(method).builder()(context)


def method_label(method: str) -> str:
    from ctrlsim.agents.methods import get_method

    return "Roster (from file)" if method == ROSTER_METHOD else get_method(method).label


def run_llm(unit: UnitContext, config):
    """The probes' LLM, answering from the run's response caches unless --cache false."""
    return unit.llm(config.llm, cached=config.cache)


def run_box(unit: UnitContext, config, box: str):
    """The black box `box` as every episode plays it (shown items masked)."""
    options: dict[str, Any] = {"mask_shown": True}
    if config.recommender_llm and box == "keyword-bm25":
        options["llm"] = config.recommender_llm
    return unit.box(box, config.dataset, **options)


# ----------------------------------------------------------------------------- driver hooks

def check(ctx) -> None:
    from ctrlsim.backends.bundled import check_cache_writable

    # Bad targets and rosters fail before any model loads.
    check_targets(ctx.config, ctx.unit.dataset(ctx.config.dataset))
    check_cache_writable(cache_uses(ctx.config))  # an unwritable $CTRLSIM_CACHE fails now, not per episode


def identity(ctx) -> dict:
    stored = config_to_dict(ctx.config)
    if ctx.config.roster is not None:
        stored["roster_sha256"] = roster_digest(ctx.config.roster)
    return stored


def resolved(ctx) -> dict:
    """Open fields as the units resolve them: the slate size per box, the LLM inside an LLM box."""
    config = ctx.config
    resolved: dict = {"slate_size": {box: config.slate_for(box) for box in config.recommenders}}
    if "keyword-bm25" in config.recommenders:
        import inspect

        from ctrlsim.recommenders.keyword_bm25 import KeywordBM25Recommender

        default = inspect.signature(KeywordBM25Recommender.__init__).parameters["llm"].default
        resolved["recommender_llm"] = {"keyword-bm25": config.recommender_llm or default}
    return resolved


def from_identity(identity) -> CtrlBenchConfig:
    return config_from_dict(CtrlBenchConfig, {k: v for k, v in identity.items() if k != "roster_sha256"})


def sizes(config: CtrlBenchConfig) -> dict[str, int]:
    """Items per target and per tag of every target."""
    dataset = UnitContext().dataset(config.dataset)
    sizes = {target: len(target_items(dataset, target)) for target in config.targets}
    sizes.update({tag: len(dataset.items_with_tag(tag)) for t in config.targets for tag in target_tags(t)})
    return sizes
