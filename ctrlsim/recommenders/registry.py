"""`make_recommender(name, dataset, **options)`: every black box by name."""
from __future__ import annotations

from typing import Callable

from ctrlsim.data import Dataset
from ctrlsim.errors import ConfigError
from ctrlsim.recommenders.base import Recommender


def _sequential(model: str) -> Callable[..., Recommender]:
    def build(dataset: Dataset, **options) -> Recommender:
        from ctrlsim.recommenders.recbole import SequentialRecommender

        return SequentialRecommender(dataset, model=model, **options)

    return build


def _lazy(module: str, cls: str) -> Callable[..., Recommender]:
    def build(dataset: Dataset, **options) -> Recommender:
        import importlib

        return getattr(importlib.import_module(f"ctrlsim.recommenders.{module}"), cls)(dataset, **options)

    build.target = (module, cls)  # type: ignore[attr-defined]  # what `box_options` inspects

    return build


RECOMMENDERS: dict[str, Callable[..., Recommender]] = {
    "nl-profile": _lazy("nl_profile", "NLProfileRecommender"),
    "sasrec": _sequential("SASRec"),
    "narm": _sequential("NARM"),
    "twhin-bert": _lazy("embedding", "TwhinBertRecommender"),
    "bge": _lazy("embedding", "BGERecommender"),
    "embedding": _lazy("embedding", "EmbeddingRecommender"),
    "keyword-bm25": _lazy("keyword_bm25", "KeywordBM25Recommender"),
    "popularity": _lazy("baselines", "PopularityRecommender"),
    "reference-controls": _lazy("reference_controls", "ReferenceControlsRecommender"),
    "reference-controls-fake": _lazy("reference_controls", "FakeNonProfiledRecommender"),
}


def register_recommender(name: str, factory: Callable[..., Recommender], *, replace: bool = False) -> None:
    """Make `factory(dataset, **options)` available as `make_recommender(name, ...)` and to every env."""
    if not name or name.startswith("recbole:") or name.split(":", 1)[0] in ("dial", "dial-profile"):
        raise ConfigError(f"invalid recommender name {name!r}")
    if name in RECOMMENDERS and not replace:
        raise ConfigError(f"recommender {name!r} is already registered; pass replace=True to override it")
    RECOMMENDERS[name] = factory


SPEC_FORMS = ("'recbole:<Model>', 'dial:<lambda>', 'dial-profile:<lambda>', an http(s):// service URL or a "
              "prc+http(s):// PRC ranker URL")


def check_recommender_name(name: str) -> None:
    """A `ConfigError` unless `make_recommender` knows `name` (nothing is built; dial specs are parsed)."""
    from ctrlsim.recommenders.dial import check_dial_spec, is_dial
    from ctrlsim.recommenders.http.options import is_http, parse_http_spec

    if not isinstance(name, str):
        raise ConfigError(f"a recommender name is a string, got {name!r}")
    if name.startswith(("prc+http://", "prc+https://")):
        from ctrlsim.recommenders.http.prc.box import check_prc_spec

        check_prc_spec(name)
    elif is_http(name):
        from ctrlsim.recommenders.http.options import checked_options

        checked_options(parse_http_spec(name)[1])
    elif is_dial(name):
        check_dial_spec(name)
    elif "#" in name:
        box_options(name)
    elif not (name.startswith("recbole:") and name.split(":", 1)[1]) and name not in RECOMMENDERS:
        raise ConfigError(f"unknown recommender {name!r}; known: {sorted(RECOMMENDERS)} or {SPEC_FORMS}")


def _value(text: str) -> object:
    """A spec option's text as the number it spells, else as text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def box_options(spec: str) -> tuple[str, dict[str, object]]:
    """(box name, options) of `NAME#key=value&...`, a registered box with constructor options in its
    name (`embedding#encoder=mpnet`): the audit and every runner take it wherever a box name goes,
    and its identity records the options. Unknown names and options are a `ConfigError`."""
    from urllib.parse import parse_qsl

    name, _, fragment = spec.partition("#")
    if name not in RECOMMENDERS:
        raise ConfigError(f"unknown recommender {name!r} in {spec!r}; known: {sorted(RECOMMENDERS)}")
    pairs = parse_qsl(fragment, keep_blank_values=True)
    if not pairs or any(not k or not v for k, v in pairs):
        raise ConfigError(f"{spec!r}: options after '#' are key=value pairs joined by '&'")
    options = {k: _value(v) for k, v in pairs}
    if len(options) != len(pairs):
        raise ConfigError(f"{spec!r}: an option is given twice")
    accepted = _constructor_options(name)
    unknown = sorted(set(options) - accepted) if accepted is not None else []
    if unknown:
        raise ConfigError(f"{spec!r}: box {name!r} takes no option(s) {unknown}; "
                          f"options: {sorted(accepted or ())}")
    return name, options


def _constructor_options(name: str) -> set[str] | None:
    """The keyword options box `name`'s constructor names (None: it takes any, or it is not a class)."""
    import importlib
    import inspect

    target = getattr(RECOMMENDERS[name], "target", None)
    if target is None:  # a factory registered from elsewhere: its options are its own business
        return None
    module, cls = target
    names: set[str] = set()
    for klass in getattr(importlib.import_module(f"ctrlsim.recommenders.{module}"), cls).__mro__:
        if "__init__" in vars(klass) and klass is not object:  # each class passes **options up
            params = inspect.signature(klass.__init__).parameters.values()
            kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            names |= {p.name for p in params if p.kind in kinds and p.name not in ("self", "dataset")}
    return names


def cache_uses(name: str, *, llm: str | None = None) -> dict[str, str]:
    """The $CTRLSIM_CACHE subfolders building box `name` writes (subfolder -> what it keeps there),
    for a runner's up-front check; nothing is built. RecBole boxes store their trained weights; the
    LLM boxes load an LLM (`llm`, else the box's default), bundled ones assembled in the cache.
    Embedding boxes need none: their encoder's disk cache is optional (`ctrlsim.backends.encoders`)."""
    from ctrlsim.backends.bundled import DEFAULT_LLM
    from ctrlsim.backends.spec_check import llm_cache_uses

    if name.startswith("recbole:") or name in ("sasrec", "narm"):
        return {"recbole": f"the trained weights of the {name} box"}
    if name in ("keyword-bm25", "nl-profile"):  # both boxes default to the bundled DEFAULT_LLM
        return llm_cache_uses(llm or DEFAULT_LLM)
    return {}


def make_dial(spec: str, dataset: Dataset, **options) -> Recommender:
    """The dial box a spec names (`dial:` or `dial-profile:`), with spec options merged under `options`."""
    from ctrlsim.recommenders.dial import DialRecommender, parse_dial_spec

    parsed = parse_dial_spec(spec)
    merged = {**parsed.options, **options}
    if parsed.kind == "dial-profile":
        from ctrlsim.recommenders.dial_profile import DialProfileRanker

        return DialProfileRanker(dataset, lam=parsed.lam, **merged)
    return DialRecommender(dataset, lam=parsed.lam, **merged)


def make_recommender(name: str, dataset: Dataset, **options) -> Recommender:
    """Build a black box by name.

    Other RecBole sequential models: "recbole:<ModelName>" (e.g. recbole:GRU4Rec). Dial boxes of
    known controllability: "dial:<lambda>[:key=value...]" and "dial-profile:<lambda>[...]"
    (`ctrlsim.recommenders.dial`). A service behind an API: "http(s)://host:port/path[#options]"
    (`ctrlsim.recommenders.http.client`). A Prosocial Ranking Challenge ranker:
    "prc+http(s)://host:port/rank[#options]" (`ctrlsim.recommenders.http.prc`).
    """
    from ctrlsim.recommenders.dial import is_dial
    from ctrlsim.recommenders.http.options import is_http

    if name.startswith(("prc+http://", "prc+https://")):  # a PRC ranker (ctrlsim.recommenders.http.prc)
        from ctrlsim.recommenders.http.prc.box import PrcRecommender

        return PrcRecommender(dataset, url=name, **options)
    if is_http(name):  # a service behind an API (ctrlsim.recommenders.http.client)
        from ctrlsim.recommenders.http.client import HttpRecommender

        return HttpRecommender(dataset, url=name, **options)
    if name.startswith("recbole:"):
        return _sequential(name.split(":", 1)[1])(dataset, **options)
    if is_dial(name):
        return make_dial(name, dataset, **options)
    if "#" in name:  # a registered box with options in its name (`box_options`)
        name, named = box_options(name)
        return RECOMMENDERS[name](dataset, **{**named, **options})
    check_recommender_name(name)
    return RECOMMENDERS[name](dataset, **options)
