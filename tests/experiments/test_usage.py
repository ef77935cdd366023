"""One token-usage reader over every record shape the runners store (counts by hand)."""
from ctrlsim.experiments.usage import TokenUsage, record_tokens, total_tokens


def test_probe_episode_keeps_a_total_only():
    assert record_tokens({"tokens": 449}) == TokenUsage(449, None, None, 0, None)


def test_ctrlbench_episode_adds_setup_and_every_probe():
    record = {"setup_tokens": 358, "probes": [{"tokens": 449}, {"tokens": 51}, {"tokens": None}],
              "setup_tokens_unknown": 1, "tokens_unknown": {"calls": 2, "of": 9},
              "validity": {"check_usage": {"prompt_tokens": 1682, "completion_tokens": 26}}}
    # 358 + 449 + 51; the validity check is the instrument's cost, not counted; 1 + 2 unknown calls
    assert record_tokens(record) == TokenUsage(858, None, None, 3, None)


def test_meter_usage_dict_of_evolve_phases():
    usage = {"prompt_tokens": 578, "completion_tokens": 160, "calls": 2, "cached_calls": 0,
             "total_tokens": 738}
    assert record_tokens({"tokens": usage}) == TokenUsage(738, 578, 160, 0, 2)
    assert record_tokens({"tokens": {"total_tokens": 7, "calls": 3, "unknown_calls": 2}}) == \
        TokenUsage(7, None, None, 2, 3)


def test_steereval_scenario_and_its_calibrate_unit():
    scenario = {"tokens": {"prompt": 1116, "completion": 65}}
    assert record_tokens(scenario) == TokenUsage(1181, 1116, 65, 0, None)
    unit = {"details": {"scenarios": 2, "tokens": {"prompt": 10, "completion": 2, "unknown_calls": 1}}}
    assert record_tokens(unit) == TokenUsage(12, 10, 2, 1, None)


def test_promptshift_user_sums_its_lists_and_counts_null_as_unknown():
    record = {"lists": [{"prompt_tokens": 132, "completion_tokens": 53},
                        {"prompt_tokens": 100, "completion_tokens": None}],
              "tokens": {"prompt_tokens": 232, "completion_tokens": 53, "calls": 2, "cached_calls": 0}}
    assert record_tokens(record) == TokenUsage(285, 232, 53, 1, 2)


def test_records_without_tokens_and_sums():
    assert record_tokens({"policy": "ppo"}) == TokenUsage()
    summed = total_tokens([{"tokens": {"prompt": 3, "completion": 1}}, {}, {"tokens": 5}])
    # A record with only a total leaves prompt/completion unknown (None) in the sum.
    assert summed == TokenUsage(9, None, None, 0, None)
    assert total_tokens([]) == TokenUsage(0, 0, 0, 0, 0)
