"""The probe-population methods the CtrlBench-Rec runner compares (§4.1 Baselines, Table 7).

A method turns one episode's context into the population that is evaluated: the personas
(the roster) and how they act. The runner (`ctrlsim ctrlbench`) then plays that population
for t rounds against the black box and measures it; a method never measures itself.

Built in:
  base-large  K_large (paper: 100) unevolved LLM persona probes from randomly sampled users
  base-small  K_small (paper: 26) unevolved LLM persona probes from their own random sample of
              users (`MethodContext.small_sample = "large"`, ctrlbench's `--small-users nested`,
              takes the first K_small of Base-Large's sample instead: the two share personas)
  random      the coin-flip probe (`RandomProbe`) on Base-Small's users with template bios: no
              LLM, no tokens; a floor, not one of the paper's methods
  oracle      `TargetSeekingProbe` on the same users: likes every target item a slate shows
              (no LLM); the reference for what liking alone can reach on the box
  module:attr a method from the user's code (`import_method`): a `MethodSpec` or a builder

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
from typing import Any, Callable, Iterable, Mapping, Sequence

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.seeding import derive_rng

from .persona import Persona

POLICIES = ("llm", "random")  # the built-in policies; a `CustomPolicy` is the third kind

# Modules that register more methods when imported (kept as strings: importing them may be heavy).
EXTENSION_MODULES: list[str] = ["ctrlsim.agents.evolution.methods"]
# Method names with a prefix, built on first use by "module:function"(name) -> MethodSpec (a string,
# like the extensions: the module imports this one).
METHOD_PREFIXES: dict[str, str] = {"rl:": "ctrlsim.agents.rl:rl_method"}  # a saved learned probe


@dataclass(frozen=True)
class CustomPolicy:
    """A policy from the user's code, for `Population.policy` (documented in docs/ctrlbench.md).

    make(agents, rngs) -> a batched policy: `agents` maps each env agent ("probe_0", ...) to its
    Persona, `rngs` each agent to its generator (seeded through the env's reset: use it for every
    random draw). The returned object's `act(observations, infos)` gets the live agents'
    observations and infos (dicts keyed by agent) and returns one action per agent
    (`{"likes": 0/1 per slate position, "query": ""}`). `per_probe(factory)` builds one from a
    per-probe `factory(persona, rng) -> object with act(observation, info) -> action`.
    name: what records and tables call the policy. uses_llm: whether it charges LLM tokens.
    In a steer-then-release episode each info carries "phase" ("baseline", "steer", "release")
    and "goal" (the target tags while steering, else []): a policy that ignores them acts as
    without phases (one that steers keeps steering). Release rounds under release_mode "skip"
    never reach the policy.
    """

    name: str
    make: Callable[[Mapping[str, Persona], Mapping[str, Any]], Any]
    uses_llm: bool = False

    @classmethod
    def per_probe(cls, name: str, factory: Callable[[Persona, Any], Any]) -> "CustomPolicy":
        def make(agents, rngs):
            return _PerProbe({a: factory(p, rngs[a]) for a, p in agents.items()})
        return cls(name, make)


class _PerProbe:
    """A batched policy made of one independent policy object per agent."""

    def __init__(self, probes: Mapping[str, Any]):
        self.probes = dict(probes)

    def act(self, observations: Mapping[str, dict], infos: Mapping[str, dict]) -> dict[str, dict]:
        return {a: self.probes[a].act(observations[a], infos[a]) for a in observations}


def policy_name(policy: "str | CustomPolicy") -> str:
    return policy if isinstance(policy, str) else policy.name


@dataclass(frozen=True)
class Population:
    """What a method hands the runner.

    personas:       the evaluated roster (probe ids unique).
    policy:         "llm" (LLM persona probes), "random" (coin-flip probes, token-free) or a
                    `CustomPolicy` (a policy from the user's code).
    prompt_variant: decision-prompt variant for LLM probes: "default" or "logic" (Appendix D.8).
    setup_tokens:   tokens spent building the roster (profile generation, evolution).
    setup_unknown_calls: how many setup calls had no reported token counts, a lower bound (a
                    persona whose tokens are unknown counts as one call): `setup_tokens` is then
                    a lower bound too.
    artefacts:      anything worth keeping in the record (cluster sizes, generations, ...).
    """

    personas: tuple[Persona, ...]
    policy: str | CustomPolicy = "llm"
    prompt_variant: str = "default"
    setup_tokens: int = 0
    artefacts: Mapping[str, Any] = field(default_factory=dict)
    setup_unknown_calls: int = 0

    def __post_init__(self):
        object.__setattr__(self, "personas", tuple(self.personas))
        if not isinstance(self.policy, CustomPolicy) and self.policy not in POLICIES:
            raise ConfigError(f"population policy must be one of {POLICIES} or a CustomPolicy, "
                              f"got {self.policy!r}")
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
    small_sample: str = "small"           # K_small methods' users: their own sample, or "large" (nested)
    # Seed histories rich in these tags, from users who liked enough of them (steering away, the
    # suppression task); () = every user, their first liked items.
    rich_in: tuple[str, ...] = ()
    _profiles: Any = field(default=None, init=False, repr=False)

    def llm(self):
        return self.llm_factory()

    @property
    def profile_generator(self):
        """The User Profile Expert on the shared LLM (loads the LLM on first use)."""
        from .profiles import ProfileGenerator

        if self._profiles is None:
            self._profiles = ProfileGenerator(self.dataset, self.llm(), settings=self.profile_settings,
                                              store=self.profile_store, rich_in=self.rich_in)
        return self._profiles

    def sample_users(self, k: int, sample: str = "large") -> list[str]:
        """The first `k` users of one of this seed's random user orders.

        sample "large" is Base-Large's order (the evolved methods start from it too); "small" is
        Base-Small's own, drawn independently, so Base-Small's probes are not a subset of
        Base-Large's (with "large", the first k_small of the same order: nested by design, and
        with greedy decoding Base-Large >= Base-Small holds by construction). With `rich_in`, only
        users who liked enough items with those tags for a rich seed history are drawn."""
        from ctrlsim.envs.roster import user_order

        if sample not in ("large", "small"):
            raise ConfigError(f"user sample must be 'large' or 'small', got {sample!r}")
        users = user_order(self.dataset)
        if self.rich_in:
            from ctrlsim.envs.roster import is_rich_user

            high, min_rating = self.profile_settings.l_init[1], self.profile_settings.min_rating
            users = [u for u in users if is_rich_user(self.dataset, u, self.rich_in, high, min_rating)]
        if not 1 <= k <= len(users):
            rich = f" (users who liked enough {'/'.join(self.rich_in)} items)" if self.rich_in else ""
            raise ConfigError(f"need between 1 and {len(users)} probes{rich}, got {k}")
        order = derive_rng(self.seed, "users" if sample == "large" else "users-small").permutation(len(users))
        return [users[i] for i in order[:k]]

    def base_personas(self, k: int, sample: str = "large") -> tuple[list[Persona], list[int | None]]:
        """LLM personas for the first `k` sampled users (cached per user, LLM, seed) and the tokens
        each cost (None: unknown, see `ProfileGenerator.generate`)."""
        from tqdm import tqdm

        users = self.sample_users(k, sample)
        with tqdm(total=len(users), desc="profiles", unit="probe", disable=not self.show_progress,
                  leave=False) as bar:
            personas, tokens = self.profile_generator.generate(users, self.seed, progress=bar.update)
        return personas, tokens

    def template_personas(self, k: int, sample: str = "large") -> list[Persona]:
        """Personas without an LLM (demographics + seed tags) for the first `k` sampled users."""
        from .profiles import ProfileGenerator

        gen = ProfileGenerator(self.dataset, None, settings=self.profile_settings, rich_in=self.rich_in)
        return [gen.template_persona(u, gen.seed_items(u, self.seed)) for u in self.sample_users(k, sample)]


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
    for prefix, factory in METHOD_PREFIXES.items():
        if name not in METHODS and isinstance(name, str) and name.startswith(prefix):
            module, _, function = factory.partition(":")
            return register_method(getattr(importlib.import_module(module), function)(name))
    if ":" in name and name not in METHODS:
        return register_method(import_method(name))
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def check_methods(names: Sequence[str]) -> None:
    """Raise `ConfigError` naming any unknown method (before any work starts)."""
    for name in names:
        get_method(name)


def method_modules(names: Iterable[str]) -> list[str]:
    """The modules whose code the registered methods among `names` run, for a run's provenance: the
    module a `module:attribute` name imported and the module each builder is defined in. Names that
    are not registered methods are skipped, and nothing is imported."""
    found: set[str] = set()
    for name in names:
        spec = METHODS.get(name) if isinstance(name, str) else None
        if spec is None:
            continue
        if ":" in name and not any(name.startswith(prefix) for prefix in METHOD_PREFIXES):
            found.add(name.partition(":")[0])
        build = spec.build
        module = build.partition(":")[0] if isinstance(build, str) else (
            getattr(build, "__module__", None) or type(build).__module__)
        if module:
            found.add(module)
    return sorted(found)


# ----------------------------------------------------------------------------- builtin methods

def _setup_cost(tokens: list[int | None]) -> dict[str, int]:
    """Population's setup fields from per-persona tokens: the known sum and how many are unknown."""
    return {"setup_tokens": sum(t for t in tokens if t is not None),
            "setup_unknown_calls": sum(t is None for t in tokens)}


def build_base_large(context: MethodContext) -> Population:
    personas, tokens = context.base_personas(context.k_large)
    return Population(tuple(personas), "llm", **_setup_cost(tokens),
                      artefacts={"template_fallbacks": sum(p.source == "template" for p in personas)})


def build_base_small(context: MethodContext) -> Population:
    personas, tokens = context.base_personas(context.k_small, context.small_sample)
    return Population(tuple(personas), "llm", **_setup_cost(tokens),
                      artefacts={"template_fallbacks": sum(p.source == "template" for p in personas),
                                 "users": context.small_sample})


def build_random(context: MethodContext) -> Population:
    return Population(tuple(context.template_personas(context.k_small, context.small_sample)), "random")


def build_oracle(context: MethodContext) -> Population:
    """Base-Small's users, each liking every target item on its slate (`TargetSeekingProbe`); in
    the baseline and release rounds of a phased episode, the items sharing a tag with its seeds."""
    from .random_probe import TargetSeekingProbe, persona_items

    target, dataset = set(context.target_items), context.dataset
    policy = CustomPolicy.per_probe("oracle", lambda persona, rng: TargetSeekingProbe(
        target, persona_items(dataset, persona.behaviour)))
    return Population(tuple(context.template_personas(context.k_small, context.small_sample)), policy)


def import_method(spec: str) -> MethodSpec:
    """The method a `module:attribute` name points at, imported now (a user's own policy).

    The attribute may be a `MethodSpec` (used as it is, under the name given), or a builder
    `build(context: MethodContext) -> Population`. An unimportable module, a missing attribute or
    anything else is a `ConfigError` naming it, raised before any model loads.
    """
    module, sep, attribute = spec.partition(":")
    if not sep or not module or not attribute:
        raise ConfigError(f"method {spec!r}: a custom method is 'module:attribute'")
    try:
        value = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"method {spec!r}: cannot import module {module!r} ({exc})") from None
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ConfigError(f"method {spec!r}: module {module!r} has no attribute {attribute!r}")
        value = getattr(value, part)
    if isinstance(value, MethodSpec):
        return MethodSpec(spec, value.label, value.build, value.uses_llm, value.description)
    if not callable(value):
        raise ConfigError(f"method {spec!r}: {attribute!r} is neither a MethodSpec nor a builder function "
                          f"(got {type(value).__name__})")
    doc = (getattr(value, "__doc__", None) or "").strip().splitlines()
    return MethodSpec(spec, attribute, value, uses_llm=True, description=doc[0] if doc else "")


register_method(MethodSpec("base-large", "Base-Large", build_base_large, True,
                           "K_large unevolved LLM persona probes from randomly sampled users"))
register_method(MethodSpec("base-small", "Base-Small", build_base_small, True,
                           "K_small unevolved LLM persona probes (the first K_small of Base-Large's users)"))
register_method(MethodSpec("random", "Random (coin flip, no LLM)", build_random, False,
                           "coin-flip probes on Base-Small's users with template bios; token-free"))
register_method(MethodSpec("oracle", "Oracle (likes every target shown, no LLM)", build_oracle, False,
                           "Base-Small's users liking every target item their slates show; a reference "
                           "for what liking alone can reach on the box"))
