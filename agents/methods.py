"""The probe-population methods the CtrlBench-Rec runner compares (§4.1 Baselines, Table 7).

A method turns one episode's context into the population that is evaluated: the personas
(the roster) and how they act. The runner (`ctrlsim ctrlbench`) then plays that population
for t rounds against the black box and measures it; a method never measures itself.

Built in:
  base-large  K_large (paper: 100) unevolved LLM persona probes from randomly sampled users
  base-small  K_small (paper: 26) of them (the first K_small of the same sample, so the two
              share personas)
  random      the coin-flip probe (`RandomProbe`) on the same K_small users with template
              bios: no LLM, no tokens; a floor, not one of the paper's methods

The paper's "random policy" baselines are LLM agents acting without evolution (Table 7 charges
them ~2,000 tokens per probe); `random` here is a truly random policy, labelled as such.

Registering a method (the evolution loop does this for kmeans-fusion, ctrlbench, ctrlbench-logic)::

    from ctrlsim.agents.methods import MethodSpec, register_method

    register_method(MethodSpec(
        name="ctrlbench", label="CtrlBench-Rec", uses_llm=True,
        build="ctrlsim.agents.evolution.methods:build_ctrlbench",   # "module:function", imported lazily
        description="K_large probes evolved by two cluster-debate-merge fusions"))

`build(context: MethodContext) -> Population`. The builder gets everything through the context:
the dataset, the episode's black box (`context.recommender`, for training interactions), the
target, the seed, K_large/K_small, the shared LLM (`context.llm()`, loaded on first use), the
profile generator (`context.base_personas(k)`), the decision settings, a work folder for
resumable artefacts and free-form `options` from the run config (`method_options[name]`).
It returns a `Population`; tokens it spent building it (profiles, debates, merges) go in
`setup_tokens`, reported apart from the evaluation tokens of Table 7.

Registration happens at import: builtin entries here; the runner imports `EXTENSION_MODULES`
(each registers its methods when imported) before validating a config, so unknown names fail
before any work starts.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.seeding import derive_rng

from .persona import Persona

POLICIES = ("llm", "random")

# Modules that register more methods when imported (kept as strings: importing them may be heavy).
EXTENSION_MODULES: list[str] = ["ctrlsim.agents.evolution.methods"]


@dataclass(frozen=True)
class Population:
    """What a method hands the runner.

    personas:       the evaluated roster (probe ids unique).
    policy:         "llm" (LLM persona probes) or "random" (coin-flip probes, token-free).
    prompt_variant: decision-prompt variant for LLM probes: "default" or "logic" (Appendix D.8).
    setup_tokens:   tokens spent building the roster (profile generation, evolution).
    artefacts:      anything worth keeping in the record (cluster sizes, generations, ...).
    """

    personas: tuple[Persona, ...]
    policy: str = "llm"
    prompt_variant: str = "default"
    setup_tokens: int = 0
    artefacts: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "personas", tuple(self.personas))
        if self.policy not in POLICIES:
            raise ConfigError(f"population policy must be one of {POLICIES}, got {self.policy!r}")
        if not self.personas:
            raise ConfigError("a population needs at least one persona")
        ids = [p.probe_id for p in self.personas]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ConfigError(f"probe ids must be unique in a population; repeated: {repeated[:5]}")


@dataclass
class MethodContext:
    """Everything a method may use to build its population for one (box, target, seed) episode."""

    dataset: Dataset
    recommender: Any                      # ctrlsim.recommenders.Recommender (the episode's black box)
    target_tags: tuple[str, ...]
    target_items: frozenset[str]
    seed: int
    k_large: int
    k_small: int
    rounds: int
    slate_size: int
    decision_settings: Any                # ctrlsim.agents.llm_probe.DecisionSettings
    profile_settings: Any                 # ctrlsim.agents.profiles.ProfileSettings
    llm_factory: Callable[[], Any]        # -> LLM, the run's shared model (loaded on first call)
    profile_store: Path | None = None     # SQLite file caching personas per (user, LLM, seed)
    work_dir: Path | None = None          # a folder for the method's resumable artefacts
    options: Mapping[str, Any] = field(default_factory=dict)
    show_progress: bool = False
    _profiles: Any = field(default=None, init=False, repr=False)

    def llm(self):
        return self.llm_factory()

    @property
    def profile_generator(self):
        """The User Profile Expert on the shared LLM (loads the LLM on first use)."""
        from .profiles import ProfileGenerator

        if self._profiles is None:
            self._profiles = ProfileGenerator(self.dataset, self.llm(), settings=self.profile_settings,
                                              store=self.profile_store)
        return self._profiles

    def sample_users(self, k: int) -> list[str]:
        """The first `k` users of this seed's random user order (nested: base-small within base-large)."""
        from ctrlsim.envs.roster import user_order

        users = user_order(self.dataset)
        if not 1 <= k <= len(users):
            raise ConfigError(f"need between 1 and {len(users)} probes, got {k}")
        order = derive_rng(self.seed, "users").permutation(len(users))
        return [users[i] for i in order[:k]]

    def base_personas(self, k: int) -> tuple[list[Persona], int]:
        """LLM personas for the first `k` sampled users (cached per user, LLM, seed) and their tokens."""
        from tqdm import tqdm

        users = self.sample_users(k)
        with tqdm(total=len(users), desc="profiles", unit="probe", disable=not self.show_progress,
                  leave=False) as bar:
            personas, tokens = self.profile_generator.generate(users, self.seed, progress=bar.update)
        return personas, sum(tokens)

    def template_personas(self, k: int) -> list[Persona]:
        """Personas without an LLM (demographics + seed tags) for the first `k` sampled users."""
        from .profiles import ProfileGenerator

        gen = ProfileGenerator(self.dataset, None, settings=self.profile_settings)
        return [gen.template_persona(u, gen.seed_items(u, self.seed)) for u in self.sample_users(k)]


@dataclass(frozen=True)
class MethodSpec:
    """A named method. `build` is a callable or a "module:function" string imported on first use."""

    name: str
    label: str
    build: Callable[[MethodContext], Population] | str
    uses_llm: bool = True
    description: str = ""

    def builder(self) -> Callable[[MethodContext], Population]:
        if callable(self.build):
            return self.build
        module, _, func = self.build.partition(":")
        return getattr(importlib.import_module(module), func)


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add a method to the registry (re-registering the same name needs `replace=True`)."""
    if spec.name in METHODS and not replace and METHODS[spec.name] != spec:
        raise ConfigError(f"method {spec.name!r} is already registered")
    METHODS[spec.name] = spec
    return spec


def load_extensions() -> None:
    """Import the modules that register further methods (missing ones are skipped: not yet installed)."""
    for module in EXTENSION_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise


def known_methods() -> list[str]:
    load_extensions()
    return list(METHODS)


def get_method(name: str) -> MethodSpec:
    load_extensions()
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def check_methods(names: Sequence[str]) -> None:
    """Raise `ConfigError` naming any unknown method (before any work starts)."""
    for name in names:
        get_method(name)


# ----------------------------------------------------------------------------- builtin methods

def build_base_large(context: MethodContext) -> Population:
    personas, tokens = context.base_personas(context.k_large)
    return Population(tuple(personas), "llm", setup_tokens=tokens,
                      artefacts={"template_fallbacks": sum(p.source == "template" for p in personas)})


def build_base_small(context: MethodContext) -> Population:
    personas, tokens = context.base_personas(context.k_small)
    return Population(tuple(personas), "llm", setup_tokens=tokens,
                      artefacts={"template_fallbacks": sum(p.source == "template" for p in personas)})


def build_random(context: MethodContext) -> Population:
    return Population(tuple(context.template_personas(context.k_small)), "random")


register_method(MethodSpec("base-large", "Base-Large", build_base_large, True,
                           "K_large unevolved LLM persona probes from randomly sampled users"))
register_method(MethodSpec("base-small", "Base-Small", build_base_small, True,
                           "K_small unevolved LLM persona probes (the first K_small of Base-Large's users)"))
register_method(MethodSpec("random", "Random (coin flip, no LLM)", build_random, False,
                           "coin-flip probes on Base-Small's users with template bios; token-free"))
