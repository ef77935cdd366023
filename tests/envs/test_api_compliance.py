"""Standard API checks: Gymnasium's check_env on every registered env, PettingZoo's parallel
API, seed and render tests on PopulationEnv, and `gymnasium.make` from model specs."""
import ctrlsim.envs  # noqa: F401 - registers the envs
import gymnasium as gym
import numpy as np
import pytest
from ctrlsim.envs import ENV_IDS, PROBE_ENV_IDS, PopulationEnv, ProbeEnv
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test, parallel_seed_test, render_test
from pettingzoo.utils.conversions import parallel_to_aec

from ctrlsim.errors import ConfigError

SMALL_LLM = "smollm2-135m"
# The one-step envs write profiles / LLM lists on every reset: over 30 s per check on 2 cores.
ONE_STEP_IDS = [pytest.param(i, marks=[pytest.mark.llm, pytest.mark.slow]) for i in sorted(ENV_IDS)
                if i not in PROBE_ENV_IDS]
EVERY_ENV_ID = sorted(PROBE_ENV_IDS) + ONE_STEP_IDS


def small_kwargs(env_id):
    """Cheap settings per env, all given as specs: the probe envs on the popularity box, the
    one-step envs on the smallest bundled LLM."""
    if env_id in PROBE_ENV_IDS:
        return {"recommender": "popularity", "budget": 6}
    if env_id == "ctrlsim/SteerEval-v0":
        return {"llm": SMALL_LLM, "pool_size": 6, "history_len": 8, "tags": ["Horror", "Romance"]}
    if env_id == "ctrlsim/PromptShift-v0":
        return {"llm": SMALL_LLM, "n_candidates": 6, "k": 4, "max_tokens": 40, "history_len": 5}
    raise AssertionError(f"no test settings for {env_id}")


def test_the_five_envs_are_registered():
    assert sorted(ENV_IDS) == ["ctrlsim/PopularityBias-v0", "ctrlsim/ProfileShaping-v0",
                               "ctrlsim/PromptShift-v0", "ctrlsim/SteerEval-v0", "ctrlsim/TargetDiscovery-v0"]
    assert all(env_id in gym.registry for env_id in ENV_IDS)


@pytest.mark.parametrize("env_id", EVERY_ENV_ID)
def test_check_env_on_every_registered_env(env_id, ml100k):
    env = gym.make(env_id, **small_kwargs(env_id))
    check_env(env.unwrapped)  # render modes included: it re-makes the env from its spec per mode


@pytest.mark.parametrize("env_id", sorted(PROBE_ENV_IDS))
def test_probe_envs_reset_with_defaults(env_id, ml100k):
    env = gym.make(env_id)  # the default box: MiniLM embeddings, no LLM
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    user = info["probe"].removeprefix("user-")
    # The default probe is seeded with the first 4-6 items the drawn user liked (rating >= 4).
    liked = ml100k.history_ids(user, min_rating=4.0)
    history = env.unwrapped.probe.record.seed_history
    assert 4 <= len(history) <= 6 and list(history) == liked[: len(history)]
    assert info["slate_item_ids"] == [str(ml100k.item_ids[i]) for i in obs["slate"]]
    assert not set(info["slate_item_ids"]) & set(history)


@pytest.mark.parametrize("env_id", ONE_STEP_IDS)
def test_one_step_envs_reset_with_defaults_on_a_small_llm(env_id):
    env = gym.make(env_id, llm=SMALL_LLM)  # every other argument at its default
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert env.unwrapped.spec.kwargs["llm"] == SMALL_LLM


def test_make_takes_specs_and_the_spec_round_trips(pop_rec):
    env = gym.make("ctrlsim/TargetDiscovery-v0", recommender="popularity", target="Horror",
                   render_mode="ansi")
    again = gym.make(gym.envs.registration.EnvSpec.from_json(env.spec.to_json()))
    a, b = env.reset(seed=3), again.reset(seed=3)
    assert a[1]["slate_item_ids"] == b[1]["slate_item_ids"] and again.unwrapped.render_mode == "ansi"
    with pytest.raises(ConfigError, match="recommender is a PopularityRecommender"):
        gym.make("ctrlsim/TargetDiscovery-v0", recommender=pop_rec)
    ProbeEnv(pop_rec)  # live objects stay possible through the constructor


def test_parallel_api_on_population_env(pop_rec):
    env = PopulationEnv(pop_rec, n_agents=4, budget=5, target="Horror")
    parallel_api_test(env, num_cycles=8)


def test_parallel_seed_test_on_population_env(emb_rec):
    parallel_seed_test(lambda: PopulationEnv(emb_rec, n_agents=3, budget=4, target="Horror"), num_cycles=5)


def test_render_test_on_population_env(pop_rec, capsys):
    def make(render_mode=None):
        return parallel_to_aec(PopulationEnv(pop_rec, n_agents=3, budget=6, target="Horror",
                                             render_mode=render_mode))

    render_test(make)  # ansi returns text, human prints and returns None
    env = PopulationEnv(pop_rec, n_agents=3, budget=6, target="Horror", render_mode="ansi")
    _, infos = env.reset(seed=0)
    text = env.render()
    assert text.startswith("3/3 probes active; coverage=0")
    assert infos["probe_0"]["slate_items"][0] in text
    with pytest.warns(UserWarning, match="render_mode"):
        assert PopulationEnv(pop_rec, n_agents=2, target="Horror").render() is None


def run_trajectory(env_factory, seed):
    env = env_factory()
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(123)
    out = [obs["slate"].tolist()]
    done = False
    while not done:
        obs, reward, term, trunc, info = env.step({"likes": rng.integers(0, 2, 3), "query": ""})
        out.append((obs["slate"].tolist(), reward, info["new_likes"]))
        done = term or trunc
    return out


def test_same_seed_same_trajectory(emb_rec):
    factory = lambda: ProbeEnv(emb_rec, budget=8, target="Horror")  # noqa: E731
    a, b = run_trajectory(factory, 5), run_trajectory(factory, 5)
    assert a == b
    assert run_trajectory(factory, 6) != a  # another seed picks another user


def test_population_same_seed_same_run(emb_rec):
    from ctrlsim.agents import RandomProbe

    def run(seed):
        env = PopulationEnv(emb_rec, n_agents=6, budget=6, target="Horror")
        obs, infos = env.reset(seed=seed)
        pols = {a: RandomProbe(env.agent_rngs[a]) for a in env.agents}
        trace = []
        while env.agents:
            obs, rew, *_ = env.step({a: pols[a].act(obs[a]) for a in env.agents})
            trace.append({a: o["slate"].tolist() for a, o in obs.items()})
        return trace, env.population_metrics()

    assert run(1) == run(1)
    assert run(1)[0] != run(2)[0]


def test_population_seeding_goes_through_gymnasium(pop_rec):
    from gymnasium.utils import seeding

    env = PopulationEnv(pop_rec, n_agents=2, budget=2, target="Horror")
    env.reset(seed=11)
    expected, _ = seeding.np_random(11)
    lengths = expected.integers(4, 7, size=2)  # the default roster's seed lengths, L_init in [4, 6]
    expected.integers(0, 2**63 - 1, size=1)  # one draw per agent's own generator
    expected.integers(0, 2**63 - 1, size=1)
    assert env.np_random.bit_generator.state == expected.bit_generator.state
    assert [len(env.probes[a].spec.history) for a in env.agents] == lengths.tolist()
    state = env.np_random.bit_generator.state
    env.reset()  # no seed: the generator goes on, it is not re-created
    assert env.np_random.bit_generator.state != state
