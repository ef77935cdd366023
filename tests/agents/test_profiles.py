"""Profile generator: seeds, parsing, the retry-then-template path, the cache; default roster bios."""
import numpy as np
import pytest
from ctrlsim.agents.profiles import (
    FALLBACK_FLAG,
    ProfileGenerator,
    ProfileSettings,
    ProfileStore,
    parse_profile,
    seed_length,
)
from ctrlsim.envs.roster import default_roster, template_bio, top_tags

from ctrlsim.errors import ConfigError, LLMOutputError


def test_seed_length_is_in_range_and_depends_only_on_seed_and_user():
    lengths = [seed_length(7, str(u), (4, 6)) for u in range(200)]
    assert set(lengths) == {4, 5, 6}
    assert lengths == [seed_length(7, str(u), (4, 6)) for u in range(200)]
    assert lengths != [seed_length(8, str(u), (4, 6)) for u in range(200)]


def test_seed_items_are_the_users_first_liked_items(ml100k):
    gen = ProfileGenerator(ml100k, None)
    items = gen.seed_items("1", 0)
    hist = ml100k.history("1", min_rating=4.0)["item_id"].tolist()
    assert items == hist[: seed_length(0, "1", (4, 6))]


def test_rich_seed_items_are_half_the_tag_then_the_first_others_oldest_first(ml100k):
    from dataclasses import replace

    from ctrlsim.agents.llm_probe import DecisionSettings
    from ctrlsim.agents.methods import MethodContext

    gen = ProfileGenerator(ml100k, None, rich_in=("War",))
    war = set(ml100k.items_with_tag("War"))
    hist = ml100k.history("1", min_rating=4.0)["item_id"].tolist()
    length = seed_length(0, "1", (4, 6))
    tagged, others = [i for i in hist if i in war], [i for i in hist if i not in war]
    want = set(tagged[:(length + 1) // 2]) | set(others[:length - (length + 1) // 2])
    assert gen.seed_items("1", 0) == [i for i in hist if i in want]
    assert sum(i in war for i in gen.seed_items("1", 0)) >= length / 2
    # Only users who liked at least ceil(6 / 2) = 3 War movies are drawn; the persona key differs.
    context = MethodContext(ml100k, None, ("War",), frozenset(war), seed=0, k_large=5, k_small=5, rounds=1,
                            slate_size=3, decision_settings=DecisionSettings(),
                            profile_settings=ProfileSettings(), llm_factory=lambda: None, rich_in=("War",))
    for user in context.sample_users(5):
        assert sum(i in war for i in ml100k.history(user, min_rating=4.0)["item_id"]) >= 3
    assert context.sample_users(5) != replace(context, rich_in=()).sample_users(5)


def test_parse_profile_accepts_fenced_json_and_trims_interests():
    text = '```json\n{"name": " Ann ", "bio": "Likes\\n noir.", "interests": ["a","b","c","d","e","f"]}\n```'
    expected = {"name": "Ann", "bio": "Likes noir.", "interests": ["a", "b", "c", "d", "e"]}
    assert parse_profile(text) == expected
    as_text = parse_profile('{"name": "B", "bio": "x", "interests": "war, noir"}')
    assert as_text["interests"] == ["war", "noir"]


@pytest.mark.parametrize("text", ["", "Ann likes movies.", '{"name": "Ann"}', '{"name": "", "bio": "x"}',
                                  '{"name": "A", "bio": "x", "interests": 3}'])
def test_unusable_profiles_raise(text):
    with pytest.raises(LLMOutputError):
        parse_profile(text)


def test_template_persona_is_built_from_demographics_and_tags(ml100k):
    gen = ProfileGenerator(ml100k, None)
    items = gen.seed_items("2", 0)
    persona = gen.template_persona("2", items, flags=(FALLBACK_FLAG,))
    assert persona.source == "template" and persona.flags == (FALLBACK_FLAG,)
    assert persona.behaviour == tuple(items)
    assert persona.bio.startswith("A 53-year-old woman")  # user 2 of ml-100k: 53, F, other
    assert set(persona.interests) == set(top_tags(ml100k, items, 5))
    assert persona.to_probe_spec().profile == persona.bio


def test_default_roster_probes_carry_a_bio(ml100k):
    specs = default_roster(ml100k, 3, np.random.default_rng(0))
    for spec in specs:
        assert spec.profile == template_bio(ml100k, spec.attributes, list(spec.history))
        first_tag = top_tags(ml100k, list(spec.history), 1)[0]
        assert first_tag in spec.profile


def test_settings_are_validated():
    with pytest.raises(ConfigError):
        ProfileSettings(l_init=(5, 4))


@pytest.mark.llm
def test_too_short_replies_are_retried_once_then_templated(ml100k, smol, tmp_path):
    # 16 tokens cannot hold the persona JSON: both tries are cut off, so the template persona is used.
    store = ProfileStore(tmp_path / "profiles.sqlite")
    gen = ProfileGenerator(ml100k, smol, settings=ProfileSettings(max_tokens=16), store=store)
    calls = smol.meter.total.calls
    personas, tokens = gen.generate(["1", "2"], seed=0)
    assert smol.meter.total.calls - calls == 4  # two users x (first try + one retry)
    assert all(p.source == "template" and FALLBACK_FLAG in p.flags for p in personas)
    assert all(t > 0 for t in tokens)


@pytest.mark.llm
def test_generated_personas_are_cached_per_user_llm_and_seed(ml100k, smol, tmp_path):
    store = ProfileStore(tmp_path / "profiles.sqlite")
    gen = ProfileGenerator(ml100k, smol, store=store)
    first, tokens = gen.generate(["1", "3"], seed=0)
    assert [p.probe_id for p in first] == ["user-1", "user-3"]
    assert all(p.behaviour == tuple(gen.seed_items(u, 0)) for p, u in zip(first, ["1", "3"]))
    calls = smol.meter.total.calls
    again, tokens_again = ProfileGenerator(ml100k, smol, store=store).generate(["3", "1"], seed=0)
    assert smol.meter.total.calls == calls  # served by the store, no LLM call
    assert again == first[::-1] and tokens_again == tokens[::-1]
    other_seed, _ = gen.generate(["1"], seed=1)
    assert smol.meter.total.calls > calls  # another seed is another cache entry
    assert len(store) == 3
