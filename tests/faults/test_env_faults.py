"""Bad input to the probe environments: each kind is a typed error whose message names the
offending value (issue: reliability, points 6, 8 and 10).

Kinds covered here (25): likes that are fractions (0.9, 1.7, nan, 1.0000001: floats are likes
only when exactly 0.0 or 1.0), strings ("1", "abc"), complex, out of range (2, -1), the wrong
length, a bare string; a query too long, with characters outside
the charset, not a string; an unknown action key; an action that is not a dict; `l_init`
reversed, zero or not integers; reset seeds that are negative, fractional, strings or
bools; a bad slate size or budget; step before reset; a step past the round budget; a
render mode that is not a string (one the env does not declare is warned about, as
`gymnasium.make` does); unknown (warned) or conflicting reset options; an unknown
user; a roster that is too large or repeats a name; a seed history given as one string; a
live object handed to `gymnasium.make`; unknown target, task and recommender names (the
target checked before a named black box loads); policy failures in a population
(reported with `drop`, malformed actions, missing actions).
"""
from __future__ import annotations

import ctrlsim.envs  # noqa: F401 - registers the envs
import gymnasium as gym
import numpy as np
import pytest
from ctrlsim.envs import PopulationEnv, ProbeEnv, ProbeSpec

from ctrlsim.errors import (
    BudgetExceededError,
    ConfigError,
    DataError,
    InvalidAction,
    ResetNeededError,
    UnknownItemError,
    UnknownUserError,
)


@pytest.fixture(scope="module")
def pop_rec(ml100k):
    from ctrlsim.recommenders import make_recommender

    return make_recommender("popularity", ml100k, mask_shown=True)


@pytest.fixture
def env(pop_rec):
    env = ProbeEnv(pop_rec, budget=3, target="Horror")
    env.reset(seed=0)
    return env


# ------------------------------------------------------------------ actions (point 6)

@pytest.mark.parametrize("likes, named", [
    ([0.9, 0, 0], "0.9"),            # cast to int this was silently "not liked"
    ([1.7, 0, 0], "1.7"),            # ... and this "liked"
    (["1", 0, 0], "'1'"),            # a string that looks like a like
    (["abc", 0, 0], "'abc'"),        # a raw ValueError before
    ([0, 2, 0], "position 1 is 2"),
    ([0, 0, -1], "position 2 is -1"),
    (np.array([0.0, 0.5, 0.0]), "0.5"),  # floats are likes only when exactly 0.0 or 1.0
    ([1.0000001, 0, 0], "1.0000001"),
    ([float("nan"), 0, 0], "nan"),
    ([np.float32(0.9), 0, 0], "0.9"),
    ([0, 0, 1 + 0j], "(1+0j)"),          # not a real number
    ([1, 0], "3 entries"),
    ("101", "'101'"),
])
def test_likes_are_checked_before_any_cast(env, likes, named):
    with pytest.raises(InvalidAction, match="likes") as err:
        env.step({"likes": likes, "query": ""})
    assert named in str(err.value)
    assert env.probe.rounds == 0  # a rejected action costs no round


@pytest.mark.parametrize("query, named", [
    ("noir " * 13, "at most 64 characters, got 65"),
    ("film noir; drop table", "';'"),
    ("café", "'é'"),
    ("two\nlines", "'\\n'"),
    (42, "42 (int)"),
])
def test_queries_outside_the_text_space_are_rejected(env, query, named):
    assert not env.action_space["query"].contains(query)  # what the declared space says
    with pytest.raises(InvalidAction, match="query") as err:
        env.step({"likes": [0, 0, 0], "query": query})
    assert named in str(err.value)
    assert env.probe.rounds == 0


def test_unknown_action_keys_and_non_dict_actions(env):
    with pytest.raises(InvalidAction, match="'qurey'"):
        env.step({"likes": [0, 0, 0], "qurey": "noir"})
    with pytest.raises(InvalidAction, match=r"\[1, 0, 0\]"):
        env.step([1, 0, 0])


def test_step_past_the_budget(env):
    for _ in range(3):
        env.step({"likes": [0, 0, 0]})
    with pytest.raises(BudgetExceededError, match="budget of 3 rounds"):
        env.step({"likes": [0, 0, 0]})


# ------------------------------------------------------------------ construction and reset (point 8)

@pytest.mark.parametrize("l_init, named", [((5, 2), "(5, 2)"), ((0, 3), "(0, 3)"), (("4", 6), "'4'"),
                                           (5, "5")])
def test_bad_l_init(pop_rec, l_init, named):
    with pytest.raises(ConfigError, match="l_init") as err:
        ProbeEnv(pop_rec, l_init=l_init)
    assert named in str(err.value)
    with pytest.raises(ConfigError, match="l_init"):
        PopulationEnv(pop_rec, n_agents=2, l_init=l_init)


@pytest.mark.parametrize("seed, named", [(-1, "-1"), (1.5, "1.5"), ("3", "'3'"), (True, "True")])
def test_bad_reset_seeds(pop_rec, seed, named):
    population = PopulationEnv(pop_rec, n_agents=2, budget=2, target="Horror")
    with pytest.raises(ConfigError, match="seed") as err:
        population.reset(seed=seed)
    assert named in str(err.value)
    with pytest.raises(ConfigError, match="seed"):
        ProbeEnv(pop_rec, budget=2).reset(seed=seed)
    population.reset(seed=np.int64(3))  # numpy integers are integers


@pytest.mark.parametrize("kwargs, named", [({"slate_size": 0}, "slate_size must be an integer >= 1, got 0"),
                                           ({"budget": 0}, "budget must be an integer >= 1, got 0"),
                                           ({"slate_size": 2.5}, "got 2.5"),
                                           ({"render_mode": 5}, "got 5")])
def test_bad_sizes_and_render_modes(pop_rec, kwargs, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        ProbeEnv(pop_rec, **kwargs)
    with pytest.raises(ConfigError):
        PopulationEnv(pop_rec, n_agents=2, **kwargs)


@pytest.mark.parametrize("mode", ["rgb_array_list", "depth_array"])
def test_unsupported_render_modes_warn_as_gymnasium_does(pop_rec, mode):
    """Like `gymnasium.make` for a mode an env does not declare: a warning naming the mode and the
    supported ones, and `render()` gives None (clients that probe render modes fall back)."""
    supported = r"\['ansi', 'human', 'rgb_array'\]"
    with pytest.warns(UserWarning, match=f"render_mode='{mode}'.*{supported}"):
        env = ProbeEnv(pop_rec, budget=2, target="Horror", render_mode=mode)
    env.reset(seed=0)
    env.step({"likes": [0, 0, 0], "query": ""})
    assert env.render() is None
    with pytest.warns(UserWarning, match=f"render_mode='{mode}'.*{supported}"):
        population = PopulationEnv(pop_rec, n_agents=2, budget=2, target="Horror", render_mode=mode)
    population.reset(seed=0)
    assert population.render() is None


def test_step_before_reset(pop_rec):
    with pytest.raises(ResetNeededError, match="reset"):
        ProbeEnv(pop_rec).step({"likes": [0, 0, 0]})
    with pytest.raises(ResetNeededError, match="reset"):
        PopulationEnv(pop_rec, n_agents=2).step({})


def test_bad_rosters(pop_rec, ml100k):
    population = PopulationEnv(pop_rec, n_agents=2, budget=2, target="Horror")
    specs = [ProbeSpec(history=("1",), name=f"p{i}") for i in range(3)]
    with pytest.raises(ConfigError, match="n_agents=2.*got 3"):
        population.reset(seed=0, options={"roster": specs})
    with pytest.raises(ConfigError, match="'p0'"):
        population.reset(seed=0, options={"roster": [specs[0], specs[0]]})
    with pytest.raises(ConfigError, match="'12'"):
        ProbeSpec(history="12")  # one string is not two items '1' and '2'
    with pytest.raises(ConfigError, match="12 \\(int\\)"):
        ProbeSpec(history=(12,))
    with pytest.raises(UnknownItemError, match="'99999'"):
        population.reset(seed=0, options={"roster": [ProbeSpec(history=("99999",))]})


def test_bad_reset_options(pop_rec):
    env = ProbeEnv(pop_rec, budget=2)
    with pytest.warns(UserWarning, match="'rooster'"):  # PettingZoo's API test passes unknown options
        PopulationEnv(pop_rec, n_agents=2).reset(seed=0, options={"rooster": []})
    with pytest.warns(UserWarning, match="'probes'"):
        env.reset(seed=0, options={"probes": ProbeSpec(history=("1",))})
    with pytest.raises(ConfigError, match="not both"):
        env.reset(seed=0, options={"probe": ProbeSpec(history=("1",)), "user_id": "5"})
    with pytest.raises(ConfigError, match="\\('1', '2'\\)"):
        env.reset(seed=0, options={"probe": ("1", "2")})
    with pytest.raises(UnknownUserError, match="no-such-user"):
        env.reset(seed=0, options={"user_id": "no-such-user"})


def test_make_rejects_live_objects(pop_rec):
    with pytest.raises(ConfigError, match="recommender is a PopularityRecommender"):
        gym.make("ctrlsim/TargetDiscovery-v0", recommender=pop_rec)
    from ctrlsim.backends import TokenMeter

    with pytest.raises(ConfigError, match="token_meter is a TokenMeter"):
        gym.make("ctrlsim/TargetDiscovery-v0", recommender="popularity", token_meter=TokenMeter())


# ------------------------------------------------------------------ names (already typed; kept so)

def test_unknown_names(pop_rec, ml100k, monkeypatch):
    with pytest.raises(DataError, match="'Nope'"):
        ProbeEnv(pop_rec, target="Nope")
    with pytest.raises(ConfigError, match="'bogus-task'"):
        ProbeEnv(pop_rec, task="bogus-task")
    with pytest.raises(ConfigError, match="'no-such-box'"):
        ProbeEnv("no-such-box", dataset=ml100k)

    def no_model(*args, **kwargs):
        raise AssertionError("the black box was built before the target was checked")

    monkeypatch.setattr("ctrlsim.envs._build.make_recommender", no_model)
    with pytest.raises(DataError, match="'Nope'"):
        ProbeEnv("narm", dataset=ml100k, target="Nope")  # NARM would train for minutes first


# ------------------------------------------------------------------ failing policies in a population

def test_policy_failures_drop_only_their_probe(pop_rec):
    population = PopulationEnv(pop_rec, n_agents=4, budget=2, target="Horror")
    population.reset(seed=0)
    population.drop("probe_0", "LLM call failed: connection refused")
    actions = {"probe_1": {"likes": [0.5, 0, 0]}, "probe_3": {"likes": [0, 0, 0]}}  # probe_2: no action
    _, rewards, terms, truncs, infos = population.step(actions)
    assert terms == {"probe_0": True, "probe_1": True, "probe_2": True, "probe_3": False}
    assert infos["probe_0"]["failure"] == "LLM call failed: connection refused"
    assert "0.5" in infos["probe_1"]["failure"] and "no action" in infos["probe_2"]["failure"]
    assert population.agents == ["probe_3"]
    with pytest.raises(ConfigError, match="'probe_0'"):
        population.drop("probe_0", "again")  # no longer live
    with pytest.raises(ConfigError, match="reason"):
        population.drop("probe_3", "")
    with pytest.raises(ConfigError, match="probe_1"):
        population.step({"probe_1": {"likes": [0, 0, 0]}, "probe_3": {"likes": [0, 0, 0]}})


def test_only_a_probes_own_failure_is_dropped_by_the_runner_loop(pop_rec):
    """An unparseable reply drops that probe (the others go on); any other error fails the unit."""
    from ctrlsim.agents import RandomProbe

    from ctrlsim.errors import LLMOutputError
    from ctrlsim.experiments.probe.units import run_population

    class Unparseable:
        def act(self, observation, info):
            raise LLMOutputError("reply was not JSON", "{not json")

    class Broken:
        def act(self, observation, info):
            raise RuntimeError("a bug, or a server that went away")

    population = PopulationEnv(pop_rec, n_agents=3, budget=4, target="Horror")
    run_population(population, lambda agent, rng: Unparseable() if agent == "probe_1" else RandomProbe(rng),
                   seed=0, checkpoints=(4,))
    assert population.failures == {"probe_1": "LLMOutputError: reply was not JSON; reply was: '{not json'"}
    assert all(population.probes[a].rounds == 4 for a in ("probe_0", "probe_2"))
    population = PopulationEnv(pop_rec, n_agents=3, budget=4, target="Horror")
    with pytest.raises(RuntimeError, match="a bug"):
        run_population(population, lambda agent, rng: Broken() if agent == "probe_1" else RandomProbe(rng),
                       seed=0, checkpoints=(4,))
