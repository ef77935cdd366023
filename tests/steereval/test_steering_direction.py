"""Behaviour: the LLM score ranker follows template edits on qwen2.5-1.5b (tag-free item text).

Measured on 2 users x 3 genres (Horror, Romance, Sci-Fi), 10-item pools: the increase
template raised AUC_t in all 6 scenarios (+0.04 to +0.28), and the ranking after the
increase edit ended above the ranking after the decrease edit in all 6. The decrease
template alone moved AUC_t down in only 2 of 6 with tag-free text (5 of 6 when item texts
list their genres: that earlier measurement came from the tag leak), so it is not
asserted. qwen2.5-0.5b does not separate the two edits at all (docs/steereval.md).
"""
import pytest
from ctrlsim.agents.steering import TemplateAppend
from ctrlsim.envs.steereval_env import SteerEvalEnv, eligible_users


@pytest.mark.llm
@pytest.mark.slow
def test_increase_edits_raise_the_tag_and_end_above_decrease_edits(ml100k, llm_or_skip):
    llm = llm_or_skip("qwen2.5-1.5b")
    env = SteerEvalEnv(dataset=ml100k, llm=llm, pool_size=10)
    pairs = []
    for user in eligible_users(ml100k)[:2]:
        for tag in ("Horror", "Romance", "Sci-Fi"):
            after = {}
            for direction in ("increase", "decrease"):
                obs, info = env.reset(options={"scenario": env.build(user, tag, direction)})
                _, reward, _, _, figures = env.step(TemplateAppend().act(obs, info))
                sign = 1 if direction == "increase" else -1
                assert reward == pytest.approx(sign * figures["delta_auc"])
                after[direction] = figures
            pairs.append((after["increase"]["delta_auc"], after["decrease"]["delta_auc"]))
    assert sum(inc > 0 for inc, _ in pairs) >= 5, pairs  # increase works in at least 5 of 6
    assert sum(inc > dec for inc, dec in pairs) >= 5, pairs  # and is told apart from decrease
