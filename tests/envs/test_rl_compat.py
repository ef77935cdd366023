"""The raw envs with RL libraries and generic Gymnasium clients (issue 23, part 1): exact float
likes, sampled actions that make a mostly-recommender episode, an "rgb_array" render mode, numpy
integers wherever Python ints go, and pickle / deepcopy of envs, caches, search index and meter."""
from __future__ import annotations

import copy
import json
import pickle
import re
import warnings

import ctrlsim.envs  # noqa: F401 - registers the envs
import gymnasium as gym
import numpy as np
import pytest
from ctrlsim.envs import PopulationEnv, ProbeEnv
from ctrlsim.envs.engine import QUERY_CHARSET, QuerySpace, check_likes
from ctrlsim.envs.registration import plain_value
from gymnasium import spaces

from ctrlsim.backends import TokenMeter
from ctrlsim.recommenders import make_recommender

PICKLE = pytest.param(lambda env: pickle.loads(pickle.dumps(env)), id="pickle")
DEEPCOPY = pytest.param(copy.deepcopy, id="deepcopy")


# ------------------------------------------------------------------ 1. exact float likes

def test_float_likes_exactly_0_or_1_are_likes():
    got = check_likes([1.0, 0.0, np.float32(1.0)], 3)
    assert got.dtype == np.int64 and got.tolist() == [1, 0, 1]
    assert check_likes(np.array([0.0, 1.0, 1.0], dtype=np.float32), 3).tolist() == [0, 1, 1]
    assert check_likes(np.array([True, False, True]), 3).tolist() == [1, 0, 1]  # bools stay
    assert check_likes(np.array([0, 1, 0], dtype=np.int8), 3).tolist() == [0, 1, 0]  # numpy ints stay
    assert check_likes([np.int64(1), np.uint8(0), np.bool_(True)], 3).tolist() == [1, 0, 1]


def test_a_float_action_as_sb3_sends_it_steps_like_the_integer_one(pop_rec, ml100k):
    floats, ints = ProbeEnv(pop_rec, budget=4, target="Horror"), ProbeEnv(pop_rec, budget=4, target="Horror")
    obs, _ = floats.reset(seed=3)
    ints.reset(seed=3)
    liked = str(ml100k.item_ids[obs["slate"][1]])  # the item at position 1, read off the observation
    a = floats.step({"likes": np.array([0.0, 1.0, 0.0], dtype=np.float32), "query": ""})
    b = ints.step({"likes": [0, 1, 0], "query": ""})
    assert a[4]["new_likes"] == [liked] == b[4]["new_likes"]
    assert a[1] == b[1] and np.array_equal(a[0]["slate"], b[0]["slate"])
    assert floats.probe.record.history[-1] == liked


# ------------------------------------------------------------------ 2. sampled actions

def matches(query: str, text: str) -> bool:
    """Whether a catalogue text holds a word of the query (what a BM25 hit needs)."""
    return any(w.lower() in text.lower() for w in re.findall(r"[A-Za-z]{3,}", query))


def test_sampled_actions_make_a_mostly_recommender_episode(pop_rec, ml100k):
    env = ProbeEnv(pop_rec, budget=50, target="Horror")
    env.action_space.seed(0)
    env.reset(seed=0)
    texts = ml100k.items["text"].tolist()
    searches = 0
    for _ in range(200):
        action = env.action_space.sample()
        assert env.action_space.contains(action)
        obs, _, _, truncated, _ = env.step(action)
        slate = obs["slate"][obs["slate"] >= 0]
        if truncated:  # the budget is spent: no next slate
            env.reset()
            continue
        if action["query"]:
            searches += 1
            assert action["query"] in ml100k.tags  # drawn from the tag names, not random characters
            assert obs["source"] == 1 and len(slate) > 0
            assert all(matches(action["query"], texts[i]) for i in slate)  # the search found items
        else:
            assert obs["source"] == 0 and len(slate) == 3  # recommender rounds: full slates
    assert 0 < searches <= 40  # search is the exception (probability 0.1)


def test_with_search_off_sampled_actions_never_search(pop_rec):
    env = ProbeEnv(pop_rec, budget=30, target="Horror", allow_search=False)
    env.action_space.seed(1)
    env.reset(seed=1)
    queries = [env.action_space.sample()["query"] for _ in range(300)]
    assert set(queries) == {""}
    for _ in range(30):  # and stepping them is valid (a query would be an InvalidAction here)
        obs, *_ = env.step(env.action_space.sample())
        assert obs["source"] == 0
    population = PopulationEnv(pop_rec, n_agents=2, budget=3, target="Horror", allow_search=False)
    space = population.action_space("probe_0")["query"]
    space.seed(2)
    assert {space.sample() for _ in range(300)} == {""}


def test_seeding_the_action_space_makes_samples_reproducible(pop_rec):
    def samples(seed):
        env = ProbeEnv(pop_rec, budget=5, target="Horror")
        env.action_space.seed(seed)
        return [(a["likes"].tolist(), a["query"]) for a in (env.action_space.sample() for _ in range(100))]

    first = samples(5)
    assert first == samples(5)
    assert first != samples(6)
    assert any(q for _, q in first)  # with search on, some samples search


def test_query_space_contains_as_text_does(ml100k):
    space = QuerySpace(vocabulary=ml100k.tags)
    text = spaces.Text(max_length=64, min_length=0, charset=QUERY_CHARSET)
    assert isinstance(space, spaces.Text) and space == text
    for value in ["", "Horror", "film noir, 1940s", "café", "x" * 64, "x" * 65, 42, None, "a;b"]:
        assert space.contains(value) == text.contains(value), value
    assert space.contains("zzz qqq")  # outside the vocabulary, still a valid query
    assert QuerySpace(vocabulary=ml100k.tags, allow_search=False).contains("Horror")
    assert set(space.vocabulary) == set(ml100k.tags)  # every ml-100k tag name lies in the charset
    assert QuerySpace(vocabulary=["ok", "café"]).vocabulary == ("ok",)
    space.seed(0)  # an explicit mask samples as Text does: here 5 characters, only "a" allowed
    mask = np.zeros(len(space.character_list), dtype=np.int8)
    mask[space.character_list.index("a")] = 1
    assert space.sample(mask=(5, mask)) == "aaaaa"
    twin = copy.deepcopy(space)  # vector envs batch spaces by copying them
    assert twin.vocabulary == space.vocabulary and twin.search_probability == 0.1


# ------------------------------------------------------------------ 3. render modes

def distinct_colours(frame: np.ndarray) -> int:
    return len(np.unique(frame.reshape(-1, 3), axis=0))


def test_rgb_array_renders_the_slate_text(pop_rec):
    env = ProbeEnv(pop_rec, budget=4, target="Horror", render_mode="rgb_array")
    first_obs, _ = env.reset(seed=0)
    first = env.render()
    assert isinstance(first, np.ndarray) and first.dtype == np.uint8
    assert first.ndim == 3 and first.shape[2] == 3 and first.shape[0] > 20 and first.shape[1] > 100
    assert distinct_colours(first) >= 5  # text on a background, anti-aliased: not blank
    assert (first != 255).any(axis=2).mean() > 0.005
    obs, *_ = env.step({"likes": [0, 0, 0], "query": ""})
    assert set(obs["slate"].tolist()).isdisjoint(first_obs["slate"].tolist())  # another slate ...
    second = env.render()
    assert second.shape == first.shape and not np.array_equal(first, second)  # ... another frame


def test_every_env_that_renders_declares_rgb_array():
    from ctrlsim.envs.promptshift_env import PromptShiftEnv
    from ctrlsim.envs.steereval_env import SteerEvalEnv

    for cls in (ProbeEnv, PopulationEnv, SteerEvalEnv, PromptShiftEnv):
        assert "rgb_array" in cls.metadata["render_modes"] and cls.metadata["render_fps"] > 0, cls


def test_population_rgb_array_keeps_its_shape(pop_rec):
    env = PopulationEnv(pop_rec, n_agents=4, budget=3, target="Horror", render_mode="rgb_array")
    env.reset(seed=0)
    frames = [env.render()]
    while env.agents:
        env.step({a: {"likes": [1, 0, 0], "query": ""} for a in env.agents})
        frames.append(env.render())
    assert all(f.dtype == np.uint8 and f.shape == frames[0].shape and f.shape[2] == 3 for f in frames)
    assert distinct_colours(frames[0]) >= 5 and not np.array_equal(frames[0], frames[1])


def test_make_with_rgb_array_as_generic_clients_ask(ml100k):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a declared mode: no warning from make or the env
        env = gym.make("ctrlsim/TargetDiscovery-v0", recommender="popularity", budget=3,
                       render_mode="rgb_array")
    env.reset(seed=0)
    assert env.render().ndim == 3
    frames = gym.make("ctrlsim/TargetDiscovery-v0", recommender="popularity", budget=3,
                      render_mode="rgb_array_list")  # Gymnasium's RenderCollection over rgb_array
    frames.reset(seed=0)
    frames.step({"likes": [0, 0, 0], "query": ""})
    collected = frames.render()
    assert len(collected) == 2 and all(f.ndim == 3 for f in collected)


# ------------------------------------------------------------------ 4. numpy integers

def test_make_takes_numpy_integers_and_its_spec_writes_json(ml100k):
    env = gym.make("ctrlsim/TargetDiscovery-v0", recommender="popularity", slate_size=np.int64(3),
                   budget=np.int64(6), l_init=(np.int32(4), np.int64(5)), allow_search=np.False_)
    obs, _ = env.reset(seed=np.int64(2))
    assert obs["slate"].shape == (3,) and env.action_space["likes"].n == 3
    engine = env.unwrapped.engine
    assert type(engine.slate_size) is int and type(engine.budget) is int and engine.allow_search is False
    written = json.loads(env.spec.to_json())["kwargs"]
    assert written["budget"] == 6 and written["slate_size"] == 3 and written["allow_search"] is False
    assert written["l_init"] == [4, 5]
    again = gym.make(env.spec)  # re-made from the spec
    twice = gym.make(gym.envs.registration.EnvSpec.from_json(env.spec.to_json()))
    slates = [e.reset(seed=2)[0]["slate"].tolist() for e in (env, again, twice)]
    assert slates[0] == slates[1] == slates[2]
    assert again.unwrapped.engine.budget == 6


def test_numpy_seeds_l_init_and_counts(pop_rec):
    a, b = ProbeEnv(pop_rec, budget=3, target="Horror"), ProbeEnv(pop_rec, budget=3, target="Horror")
    obs_a, info_a = a.reset(seed=np.int64(7))
    obs_b, info_b = b.reset(seed=7)
    assert as_json((obs_a, info_a)) == as_json((obs_b, info_b))
    env = ProbeEnv(pop_rec, budget=3, l_init=(np.int64(2), np.int32(2)))
    assert env.l_init == (2, 2) and all(type(v) is int for v in env.l_init)
    env.reset(seed=0)
    assert len(env.probe.record.seed_history) == 2
    population = PopulationEnv(pop_rec, n_agents=np.int64(3), slate_size=np.int16(2), budget=np.uint8(2),
                               target="Horror")
    assert population.possible_agents == ["probe_0", "probe_1", "probe_2"]
    assert type(population.n_agents) is int
    obs, _ = population.reset(seed=np.int32(1))
    again, _ = PopulationEnv(pop_rec, n_agents=3, slate_size=2, budget=2, target="Horror").reset(seed=1)
    assert as_json(obs) == as_json(again)
    assert population.observation_space("probe_0")["round"].n == 3


def test_plain_value_converts_numpy_scalars_inside_containers():
    got = plain_value({"a": np.int64(1), "b": (np.float32(0.5), [np.bool_(True), np.str_("x")]),
                       np.str_("c"): np.array([1, 2])})
    assert got == {"a": 1, "b": (0.5, [True, "x"]), "c": [1, 2]}
    assert type(got["a"]) is int and type(got["b"][1][0]) is bool and type(list(got)[2]) is str
    json.dumps(got)


# ------------------------------------------------------------------ 5. pickle and deepcopy

@pytest.fixture
def emb_rec_with_disk_cache(emb_rec, minilm, ml100k, tmp_path):
    """The embedding box whose encoder holds an open SQLite cache (a lock and a connection); its
    vectors come from the session encoder's memory cache and weights, so nothing loads again."""
    from ctrlsim.backends.encoders import EmbeddingCache, load_encoder

    encoder = load_encoder("minilm", cache=False)
    encoder._memory = dict(minilm._memory)
    encoder.model = minilm.model  # the probes' profile texts are encoded with the session's weights
    encoder._disk = EmbeddingCache(tmp_path / "vectors.sqlite")
    encoder._disk.put_many({"a-key": np.ones(4, dtype=np.float32)})
    return make_recommender("embedding", ml100k, encoder=encoder, mask_shown=True)


def as_json(value) -> str:
    """Observations / infos as comparable text (arrays as lists; NaN written the same both sides)."""
    return json.dumps(value, sort_keys=True,
                      default=lambda o: o.tolist() if hasattr(o, "tolist") else repr(o))


ACTIONS = [{"likes": [1, 0, 0], "query": ""}, {"likes": [0, 0, 0], "query": "Horror"},
           {"likes": [0, 1, 1], "query": ""}, {"likes": [1, 1, 0], "query": ""},
           {"likes": [0, 0, 0], "query": "Film-Noir"}, {"likes": [0, 0, 1], "query": ""}]


def run_probe(env, actions):
    return [as_json(env.step(a)) for a in actions]


def make_box(name, request):
    if name == "embedding":
        return request.getfixturevalue("emb_rec_with_disk_cache")
    return make_recommender(name, request.getfixturevalue("ml100k"), mask_shown=True)


@pytest.mark.parametrize("copier", [PICKLE, DEEPCOPY])
@pytest.mark.parametrize("box", ["popularity", "embedding", "dial:1"])
def test_a_copied_probe_env_continues_the_same_episode(box, copier, request):
    env = ProbeEnv(make_box(box, request), budget=10, target="Horror")
    env.reset(seed=4)
    run_probe(env, ACTIONS[:2])  # one search already done: the env holds its search index
    assert env.engine._search is not None
    twin = copier(env)
    assert twin.engine is not env.engine and twin.probe is not env.probe
    copied = run_probe(twin, ACTIONS[2:])  # the copy first: the original must not notice
    assert env.probe.rounds == 2
    assert run_probe(env, ACTIONS[2:]) == copied
    assert twin.probe.record.history == env.probe.record.history
    if box == "embedding":
        mine, theirs = env.recommender.encoder._disk, twin.recommender.encoder._disk
        assert theirs is not mine and theirs._conn is not mine._conn and theirs.path == mine.path
        theirs.put_many({"from-the-copy": np.zeros(4, dtype=np.float32)})  # reopened by path: one file
        assert mine.get_many(["from-the-copy"])["from-the-copy"].tolist() == [0.0] * 4
        assert not twin.recommender.encoder.loaded  # the weights were not copied


@pytest.mark.parametrize("copier", [PICKLE, DEEPCOPY])
@pytest.mark.parametrize("box", ["popularity", "embedding", "dial:1"])
def test_a_copied_population_env_with_a_token_meter_continues(box, copier, request):
    meter = TokenMeter()
    env = PopulationEnv(make_box(box, request), n_agents=3, budget=6, target="Horror", token_meter=meter)
    env.reset(seed=2)
    keys = {a: env.probes[a].key for a in env.agents}

    def run(population, steps):
        out = []
        for n in range(steps):
            for i, agent in enumerate(population.agents):  # an LLM probe's calls, charged to its key
                population.engine.token_meter.add(10 + i, n, key=keys[agent])
            actions = {a: ACTIONS[(n + i) % len(ACTIONS)] for i, a in enumerate(population.agents)}
            out.append(as_json(population.step(actions)))
        return out + [as_json(population.population_metrics())]

    run(env, 2)
    twin = copier(env)
    assert twin.engine.token_meter is not meter and twin.engine.token_meter.total == meter.total
    copied = run(twin, 3)
    assert meter.total.calls == 6  # the copy's calls went to its own meter
    assert run(env, 3) == copied
    assert twin.engine.token_meter.by_key() == meter.by_key()


def test_the_parts_survive_pickle_on_their_own(tmp_path, ml100k, minilm, emb_rec):
    from ctrlsim.backends.cache import ResponseCache
    from ctrlsim.recommenders.search import CatalogueSearch

    cache = ResponseCache(tmp_path / "replies.sqlite")
    cache.put_many({"k1": {"text": "hello"}})
    twin = pickle.loads(pickle.dumps(cache))
    assert twin.get_many(["k1"]) == {"k1": {"text": "hello"}}
    twin.put_many({"k2": [1, 2]})  # written through the copy's own connection, to the same file
    assert cache.get_many(["k2"]) == {"k2": [1, 2]} and len(copy.deepcopy(cache)) == 2

    meter = TokenMeter()
    meter.add(3, 4, key="p")
    meter.add(None, 2, key="q")
    again = pickle.loads(pickle.dumps(meter))
    assert again.by_key() == meter.by_key() and again.total == meter.total
    again.add(1, 1, key="p")
    assert again.usage("p").total_tokens == 9 and meter.usage("p").total_tokens == 7

    search = CatalogueSearch(ml100k)
    for twin in (pickle.loads(pickle.dumps(search)), copy.deepcopy(search)):
        query = "haunted house horror"
        assert twin.search(query, 5).tolist() == search.search(query, 5).tolist()

    assert minilm.loaded  # the session encoder computed the catalogue's vectors
    text = ml100k.items["text"].iat[0]
    light = pickle.loads(pickle.dumps(minilm))  # the weights stay behind; cached vectors travel
    assert not light.loaded
    assert np.array_equal(light.encode([text]), minilm.encode([text])) and not light.loaded
