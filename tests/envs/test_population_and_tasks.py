import numpy as np
import pytest
from ctrlsim.agents import RandomProbe, TargetSeekingProbe
from ctrlsim.envs import PopulationEnv, ProbeEnv, ProbeRecord, ProbeSpec, TargetDiscovery
from ctrlsim.envs.ceiling import controllability_ceiling
from ctrlsim.envs.roster import default_roster

from ctrlsim.errors import ConfigError


def popularity_order(ml100k) -> list[str]:
    """Catalogue ids by popularity, ties in catalogue order: the popularity box's ranking, computed here."""
    pop = ml100k.items["popularity"].tolist()
    ids = ml100k.items["item_id"].tolist()
    return [ids[i] for i in sorted(range(len(ids)), key=lambda i: (-pop[i], i))]


def seeker_by_hand(order, seed_history, target, slate_size, rounds):
    """Slates and likes of a target-seeking probe on the popularity box with shown items masked."""
    history, shown, slates, likes = list(seed_history), set(), [], []
    for _ in range(rounds):
        slate = [i for i in order if i not in history and i not in shown][:slate_size]
        liked = [i for i in slate if i in target]
        slates.append(slate)
        likes.append(liked)
        history += liked
        shown |= set(slate)
    return slates, likes


def test_target_seeking_population_matches_a_hand_simulation(pop_rec, ml100k):
    target = set(ml100k.items_with_tag("Horror"))
    specs = default_roster(ml100k, 3, np.random.default_rng(0))
    env = PopulationEnv(pop_rec, n_agents=3, budget=8, target="Horror")
    obs, infos = env.reset(seed=0, options={"roster": specs})
    seeker, rewards = TargetSeekingProbe(target), {a: [] for a in env.agents}
    slates = {a: [infos[a]["slate_item_ids"]] for a in env.agents}
    while env.agents:
        obs, rew, _, _, infos = env.step({a: seeker.act(obs[a], infos[a]) for a in env.agents})
        for a, r in rew.items():
            rewards[a].append(r)
            slates[a].append(infos[a]["slate_item_ids"])
    order = popularity_order(ml100k)
    found = set()
    for agent, spec in zip(env.possible_agents, specs):
        want_slates, want_likes = seeker_by_hand(order, spec.history, target, 3, 8)
        assert slates[agent][:8] == want_slates
        assert env.probes[agent].record.likes_per_round == want_likes
        assert rewards[agent] == [float(len(x)) for x in want_likes]  # reward = new target likes
        found |= {i for x in want_likes for i in x}
    metrics = env.population_metrics()
    assert metrics["coverage"] == pytest.approx(len(found) / len(target))
    assert metrics["avg_len"] == pytest.approx(np.mean([sum(map(len, seeker_by_hand(
        order, s.history, target, 3, 8)[1])) for s in specs]))
    assert len(found) > 0  # the popular Horror titles (e.g. Alien, Scream) are on the first slates


def test_drop_ends_a_failing_probe_and_the_others_go_on(emb_rec):
    env = PopulationEnv(emb_rec, n_agents=4, budget=3, target="Horror")
    obs, _ = env.reset(seed=0)
    env.drop("probe_1", "LLM reply could not be parsed")
    actions = {a: {"likes": [1, 0, 0], "query": ""} for a in env.agents if a != "probe_1"}
    actions["probe_2"] = {"likes": [5, 5, 5]}
    obs, rew, term, trunc, info = env.step(actions)
    assert term == {"probe_0": False, "probe_1": True, "probe_2": True, "probe_3": False}
    assert info["probe_1"]["failure"] == "LLM reply could not be parsed"
    failure = info["probe_2"]["failure"]
    assert failure.startswith("InvalidAction") and "position 0 is 5" in failure
    assert rew["probe_1"] == rew["probe_2"] == 0.0
    assert env.agents == ["probe_0", "probe_3"] and env.probes["probe_1"].rounds == 0
    while env.agents:
        env.step({a: {"likes": [0, 1, 0], "query": ""} for a in env.agents})
    assert set(env.failures) == {"probe_1", "probe_2"}
    # probe_0 and probe_3 liked one new item in each of 3 rounds; the dropped ones nothing.
    assert env.population_metrics()["avg_len"] == pytest.approx((3 + 3 + 0 + 0) / 4)


def test_possible_agents_fixed_and_roster_swaps(emb_rec, ml100k):
    specs = default_roster(ml100k, 6, np.random.default_rng(0))
    pop = PopulationEnv(emb_rec, n_agents=5, budget=4, target="Horror")
    possible = list(pop.possible_agents)
    assert possible == [f"probe_{i}" for i in range(5)]
    _, infos = pop.reset(seed=0, options={"roster": specs[:3]})
    assert pop.agents == ["probe_0", "probe_1", "probe_2"] and pop.possible_agents == possible
    assert [infos[a]["probe"] for a in pop.agents] == ["user-1", "user-2", "user-3"]
    pop.reset(seed=0)  # default roster: the first n_agents users
    assert pop.agents == possible and pop.possible_agents == possible
    with pytest.raises(ConfigError, match="got 6"):
        pop.reset(seed=0, options={"roster": specs})
    with pytest.raises(ConfigError, match="'user-1'"):
        pop.reset(seed=0, options={"roster": [specs[0], specs[1], specs[0]]})


def test_token_keys_follow_probes_across_roster_swaps(emb_rec, ml100k):
    from ctrlsim.backends import TokenMeter

    a, b, c = default_roster(ml100k, 3, np.random.default_rng(0))
    meter = TokenMeter()
    env = PopulationEnv(emb_rec, n_agents=2, budget=3, target="Horror", token_meter=meter)
    env.reset(seed=0, options={"roster": [a, b]})
    meter.add(100, 20, key=a.name)  # probe a's LLM calls, charged under its id
    _, _, _, _, infos = env.step({ag: {"likes": [0, 0, 0]} for ag in env.agents})
    assert infos["probe_0"]["tokens"]["total_tokens"] == 120
    assert infos["probe_1"]["tokens"]["total_tokens"] == 0
    assert env.population_metrics()["avg_tokens"] == pytest.approx(60.0)
    # New roster: c takes a's old slot and must not inherit a's tokens; a moves to slot 1.
    _, infos = env.reset(seed=0, options={"roster": [c, a]})
    meter.add(7, 3, key=a.name)
    _, _, _, _, infos = env.step({ag: {"likes": [0, 0, 0]} for ag in env.agents})
    assert infos["probe_0"]["probe"] == c.name and infos["probe_0"]["tokens"]["total_tokens"] == 0
    assert infos["probe_1"]["probe"] == a.name and infos["probe_1"]["tokens"]["total_tokens"] == 10
    assert meter.usage(a.name).total_tokens == 130 and meter.usage("probe_0").total_tokens == 0


def test_roster_replacement_and_batched_equals_single(emb_rec, ml100k):
    specs = default_roster(ml100k, 5, np.random.default_rng(0))
    pop = PopulationEnv(emb_rec, n_agents=5, budget=4, target="Horror")
    obs, infos = pop.reset(seed=0, options={"roster": specs[:3]})
    likes = {"likes": [1, 0, 1], "query": ""}
    pop_trace = []
    while pop.agents:
        obs, *_ , infos = pop.step({a: likes for a in pop.agents})
        pop_trace.append([infos[a]["slate_item_ids"] for a in sorted(infos)])
    for n, spec in enumerate(specs[:3]):
        single = ProbeEnv(emb_rec, budget=4, target="Horror")
        single.reset(seed=0, options={"probe": spec})
        for t in range(4):
            _, _, _, _, info = single.step(likes)
            assert info["slate_item_ids"] == pop_trace[t][n]


def test_default_roster_is_first_users_with_4_to_6_likes(ml100k):
    specs = default_roster(ml100k, 10, np.random.default_rng(3))
    assert [s.name for s in specs] == [f"user-{i}" for i in range(1, 11)]
    assert all(4 <= len(s.history) <= 6 for s in specs)
    assert specs[0].attributes["gender"] in ("M", "F")
    with pytest.raises(ConfigError):
        default_roster(ml100k, 0, np.random.default_rng(0))


def test_target_seeking_beats_random_on_coverage(emb_rec, ml100k):
    target = set(ml100k.items_with_tag("Horror"))

    def run(factory):
        env = PopulationEnv(emb_rec, n_agents=10, budget=10, target="Horror")
        obs, infos = env.reset(seed=0)
        pols = {a: factory(env.agent_rngs[a]) for a in env.agents}
        while env.agents:
            obs, _, _, _, infos = env.step({a: pols[a].act(obs[a], infos[a]) for a in env.agents})
        return env.population_metrics(), [p.record.likes for p in env.probes.values()]

    (seek, seek_likes), (rand, rand_likes) = run(lambda rng: TargetSeekingProbe(target)), run(RandomProbe)
    assert seek["coverage"] > rand["coverage"]
    # A seeker likes only targets; coverage is the share of the target any probe liked.
    assert all(i in target for likes in seek_likes for i in likes)
    for metrics, likes in ((seek, seek_likes), (rand, rand_likes)):
        found = {i for x in likes for i in x} & target
        assert metrics["coverage"] == pytest.approx(len(found) / len(target))
        assert metrics["avg_len"] == pytest.approx(sum(map(len, likes)) / 10)


def test_profile_shaping_accuracy_rises_when_liking_targets(emb_rec, ml100k):
    action = ml100k.items_with_tag("Action")
    romance = [i for i in ml100k.items_with_tag("Romance") if i not in set(action)]
    env = ProbeEnv(emb_rec, task="profile-shaping", target=["Action"], budget=9)
    obs, info = env.reset(seed=0, options={"probe": ProbeSpec(history=tuple(romance[:4]))})
    seeker = TargetSeekingProbe(set(action))
    rewards = []
    for _ in range(9):
        obs, r, _, _, info = env.step(seeker.act(obs, info))
        rewards.append(r)
    m = info["metrics"]
    assert m["accuracy"] > m["accuracy_start"]
    # Appendix D.7 by hand: multi-hot tag vectors centred by the catalogue mean; the probe's vector
    # is the mean of its history's centred vectors, compared with the Action items' centroid.
    tags = list(ml100k.tags)
    vectors = np.array([[t in item_tags for t in tags] for item_tags in ml100k.items["tags"]], dtype=float)
    centred = vectors - vectors.mean(axis=0)
    target = centred[ml100k.indices(action)].mean(axis=0)
    record = env.probe.record

    def accuracy(history):
        v = centred[ml100k.indices(list(history))].mean(axis=0)
        return float(v @ target / (np.linalg.norm(v) * np.linalg.norm(target)))

    assert m["accuracy_start"] == pytest.approx(accuracy(record.seed_history))
    assert m["accuracy"] == pytest.approx(accuracy(record.history))
    # Eq. 2 by hand: JS divergence (base 2) of the shown items' tag shares against uniform Action.
    counts = np.zeros(len(tags))
    for s in record.slates:
        for i in s:
            own = [tags.index(t) for t in ml100k.items["tags"].iat[i]]
            counts[own] += 1 / len(own)
    p, q = counts / counts.sum(), np.array([t == "Action" for t in tags], dtype=float)
    mix = (p + q) / 2

    def kl(a, b):
        keep = a > 0
        return float(np.sum(a[keep] * np.log2(a[keep] / b[keep])))

    assert m["js_divergence"] == pytest.approx((kl(p, mix) + kl(q, mix)) / 2)


def test_popularity_task_reward_is_minus_slate_popularity(pop_rec, ml100k):
    env = ProbeEnv(pop_rec, task="popularity-bias", budget=3)
    obs, info = env.reset(seed=0)
    pop = ml100k.items["popularity"].to_numpy()
    slate = obs["slate"]
    _, r, _, _, info = env.step({"likes": [1, 0, 1], "query": ""})
    assert r == pytest.approx(-pop[slate].mean() / pop.max())
    assert info["metrics"]["slate_popularity"] == pytest.approx(pop[slate].mean())
    # Eq. 3 over the items interacted with: the two liked positions.
    assert info["metrics"]["mean_popularity"] == pytest.approx(pop[slate[[0, 2]]].mean())


def test_ceiling_bounds_reachability(emb_rec, ml100k):
    specs = default_roster(ml100k, 3, np.random.default_rng(0))
    target = set(ml100k.items_with_tag("Horror"))
    res = controllability_ceiling(emb_rec, specs, target, slate_size=3, budget=6, max_states_per_probe=60,
                                  keep_graphs=True)
    assert 0 < res.coverage_ceiling <= 1
    assert res.ceiling_at(1) <= res.ceiling_at(3) <= res.ceiling_at(6) == res.coverage_ceiling
    assert res.states_expanded <= 3 * 60 and not res.exhaustive
    assert all(0 <= r < 6 for r in res.first_round.values())
    # Round 0 is each probe's first slate: the targets on it are reachable with no action.
    env = PopulationEnv(emb_rec, n_agents=3, budget=6, target="Horror")
    _, infos = env.reset(seed=0, options={"roster": specs})
    first = {i for a in env.agents for i in infos[a]["slate_item_ids"] if i in target}
    assert {i for i, r in res.first_round.items() if r == 0} == first
    # The root's children are "skip" plus one "like" per item of its first slate.
    root = (tuple(specs[0].history), frozenset())
    assert sorted(d["action"] for _, _, d in res.graphs[0].out_edges(root, data=True)) == sorted(
        ["skip"] + [f"like {i}" for i in infos["probe_0"]["slate_item_ids"]])
    with pytest.raises(ConfigError):
        controllability_ceiling(emb_rec, specs, target, slate_size=3, budget=6, max_states_per_probe=2)


def test_probe_record_history():
    rec = ProbeRecord(("1", "2"), likes=["3"])
    assert rec.history == ("1", "2", "3")


def test_target_discovery_reports_both_efficiencies(ml100k):
    """Hand-computed: 3 probes, target likes 2 + 1 + 0 over 2 distinct targets; 6 likes in all."""
    task = TargetDiscovery(ml100k, "Film-Noir")
    noir = sorted(task.target)[:2]
    other = [i for i in ml100k.item_ids if i not in task.target][:3]
    records = [ProbeRecord(seed_history=(), likes=[noir[0], noir[1], other[0]]),
               ProbeRecord(seed_history=(), likes=[noir[0], other[1]]),
               ProbeRecord(seed_history=(), likes=[other[2]])]
    metrics = task.population_metrics(records)
    assert metrics["efficiency"] == 3 / 2          # target likes per distinct target (paper's code)
    assert metrics["efficiency_all_likes"] == 6 / 2  # Table 5's literal formula
    assert metrics["coverage"] == 2 / len(task.target)
