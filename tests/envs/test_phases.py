"""Steer-then-release episodes: `PhasePlan` by hand, and the phase and goal the envs' infos announce."""
import pytest
from ctrlsim.agents import RandomProbe
from ctrlsim.envs import PhasePlan, PopulationEnv, ProbeEnv
from pettingzoo.test import parallel_api_test

from ctrlsim.errors import ConfigError

B, S, R = "baseline", "steer", "release"


@pytest.mark.parametrize("fields, message", [
    ({"baseline": 0, "steer": 3, "release": 2}, "PhasePlan.baseline must be an integer >= 1, got 0"),
    ({"baseline": 2, "steer": -1, "release": 2}, "PhasePlan.steer must be an integer >= 1, got -1"),
    ({"baseline": 2, "steer": 3, "release": 1.5}, "PhasePlan.release must be an integer >= 1, got 1.5"),
    ({"baseline": True, "steer": 3, "release": 2}, "PhasePlan.baseline must be an integer >= 1, got True"),
    ({"baseline": 2, "steer": 3, "release": 2, "release_mode": "off"},
     "PhasePlan.release_mode must be one of ('baseline', 'skip'), got 'off'"),
    ({"baseline": 2, "steer": 3, "release": 2, "direction": "down"},
     "PhasePlan.direction must be one of ('toward', 'away'), got 'down'"),
])
def test_a_bad_plan_names_its_field_and_value(fields, message):
    with pytest.raises(ConfigError) as caught:
        PhasePlan(**fields)
    assert str(caught.value) == message


def test_phase_of_by_hand():
    plan = PhasePlan(2, 3, 2)
    assert plan.total == 7
    assert [plan.phase_of(n) for n in range(1, 8)] == [B, B, S, S, S, R, R]
    assert [plan.skips(n) for n in range(1, 8)] == [False] * 7
    assert [PhasePlan(1, 1, 2, "skip").skips(n) for n in range(1, 5)] == [False, False, True, True]
    for outside in (0, 8):
        with pytest.raises(ConfigError, match=f"round_no must be an integer in 1..7, got {outside}"):
            plan.phase_of(outside)
    assert plan.to_dict() == {"baseline": 2, "steer": 3, "release": 2, "release_mode": "baseline"}
    assert PhasePlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ConfigError, match="no field"):
        PhasePlan.from_dict({"baseline": 2, "steer": 3, "release": 2, "mode": "skip"})


def test_infos_announce_the_phase_and_goal_of_the_next_round(pop_rec):
    env = PopulationEnv(pop_rec, n_agents=3, target=["War", "Horror"], phases=PhasePlan(2, 3, 2))
    assert env.engine.budget == 7 and env.config["phases"]["steer"] == 3
    obs, infos = env.reset(seed=0)
    probes = {a: RandomProbe(env.agent_rngs[a], 0.5) for a in env.agents}
    seen = [infos]
    while env.agents:
        obs, _, _, truncs, infos = env.step({a: probes[a].act(obs[a]) for a in env.agents})
        seen.append(infos)
    assert len(seen) == 8 and all(truncs.values())
    # After reset: round 1's; after step k: round k + 1's; after the last step: round 7's.
    want = [B, B, S, S, S, R, R, R]
    for infos, phase in zip(seen, want):
        assert {i["phase"] for i in infos.values()} == {phase}
        assert {tuple(i["goal"]) for i in infos.values()} == {("War", "Horror") if phase == S else ()}
        assert {i["direction"] for i in infos.values()} == {"toward"}


def test_an_away_plan_is_announced_and_stored_with_its_direction(pop_rec):
    from ctrlsim.envs.phases import is_steering, steers_away

    plan = PhasePlan(1, 1, 1, direction="away")
    assert plan.to_dict()["direction"] == "away" and PhasePlan.from_dict(plan.to_dict()) == plan
    env = PopulationEnv(pop_rec, n_agents=2, target="War", phases=plan)
    _, infos = env.reset(seed=0)
    assert {i["direction"] for i in infos.values()} == {"away"}
    _, _, _, _, infos = env.step({a: {"likes": [0, 0, 0], "query": ""} for a in env.agents})
    info = next(iter(infos.values()))
    assert info["phase"] == S and info["goal"] == ["War"] and steers_away(info) and is_steering(info)
    assert not steers_away({**info, "phase": R}) and not steers_away({**info, "direction": "toward"})
    assert not steers_away(None)


def test_probe_env_announces_the_same_and_takes_the_plan_as_a_dict(pop_rec):
    env = ProbeEnv(pop_rec, target="War", phases={"baseline": 1, "steer": 1, "release": 1})
    assert env.phases == PhasePlan(1, 1, 1) and env.config["budget"] == 3
    obs, info = env.reset(seed=0)
    phases, goals = [info["phase"]], [info["goal"]]
    truncated = False
    while not truncated:
        obs, _, _, truncated, info = env.step({"likes": [0, 0, 0], "query": ""})
        phases.append(info["phase"])
        goals.append(info["goal"])
    assert phases == [B, S, R, R] and goals == [[], ["War"], [], []]


def test_a_budget_that_differs_from_the_plan_is_a_config_error(pop_rec):
    plan = PhasePlan(2, 3, 2)
    for make in (PopulationEnv, ProbeEnv):
        with pytest.raises(ConfigError, match=r"budget=5 differs from the phase plan's 7 rounds"):
            make(pop_rec, target="War", budget=5, phases=plan)
        assert make(pop_rec, target="War", budget=7, phases=plan).engine.budget == 7  # agreeing is fine
    with pytest.raises(ConfigError, match="phases must be a PhasePlan"):
        PopulationEnv(pop_rec, target="War", phases=(2, 3, 2))


def test_without_phases_nothing_is_added(pop_rec):
    env = PopulationEnv(pop_rec, n_agents=2, target="War")
    assert env.phases is None and env.engine.budget == 20 and "phases" not in env.config
    obs, infos = env.reset(seed=0)
    obs, _, _, _, step_infos = env.step({a: {"likes": [1, 0, 0], "query": ""} for a in env.agents})
    for info in [*infos.values(), *step_infos.values()]:
        assert "phase" not in info and "goal" not in info
    _, info = ProbeEnv(pop_rec, target="War").reset(seed=0)
    assert "phase" not in info and "goal" not in info


def test_parallel_api_holds_with_phases(pop_rec):
    parallel_api_test(PopulationEnv(pop_rec, n_agents=3, target="War", phases=PhasePlan(1, 2, 1)),
                      num_cycles=6)
