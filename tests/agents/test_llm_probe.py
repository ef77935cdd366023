"""LLM persona probes: prompt layout, memory, batched population episodes on a real model."""
import pytest
from ctrlsim.agents import DecisionSettings, LLMPopulationPolicy, Population, play_population
from ctrlsim.agents.persona import Persona
from ctrlsim.agents.profiles import ProfileGenerator
from ctrlsim.envs import PopulationEnv
from decision_check import usable_decision

from ctrlsim.backends import ResponseCache, TokenMeter


@pytest.fixture(scope="module")
def personas(ml100k):
    gen = ProfileGenerator(ml100k, None)
    return [gen.template_persona(u, gen.seed_items(u, 0)) for u in ("1", "2", "3", "4")]


def slate_info(ids, round_no=0, source="recommender"):
    return {"slate_item_ids": list(ids), "round": round_no, "slate_source": source}


def test_shared_text_comes_first_and_goal_is_optional(ml100k, personas):
    agents = {"probe_0": personas[0], "probe_1": personas[1]}
    shown = LLMPopulationPolicy(None, ml100k, agents, target=["Film-Noir"])
    convs = [shown.conversation(a, slate_info(["1", "2", "3"]), 3, 10) for a in agents]
    assert convs[0][0] == convs[1][0] and convs[0][0]["role"] == "system"  # one shared prefix
    assert "Film-Noir" in convs[0][0]["content"]
    assert "Never like movies unrelated to your interests" in convs[0][0]["content"]  # Appendix B
    assert personas[0].bio in convs[0][1]["content"] and personas[1].bio not in convs[0][1]["content"]
    hidden = LLMPopulationPolicy(None, ml100k, agents, target=["Film-Noir"],
                                 settings=DecisionSettings(target_visible=False))
    assert "Film-Noir" not in hidden.conversation("probe_0", slate_info(["1", "2", "3"]), 3, 10)[0]["content"]


def test_memory_keeps_the_last_m_rounds_with_titles_tags_likes_and_searches(ml100k, personas):
    policy = LLMPopulationPolicy(None, ml100k, {"probe_0": personas[0]}, target=["War"],
                                 settings=DecisionSettings(memory_rounds=2))
    slates = [["1", "2", "3"], ["4", "5", "6"], ["7", "8", "9"]]
    replies = ['{"like": [1], "search": ""}', '{"like": [], "search": "war films"}', "no idea"]
    for n, (ids, reply) in enumerate(zip(slates, replies)):
        action = policy._decide("probe_0", reply, slate_info(ids, n), 3)
    assert list(action["likes"]) == [0, 0, 0] and action["query"] == ""  # prose = skipped round
    stats = policy.probe_stats("probe_0")
    assert stats["parse_failures"] == 1 and stats["decisions"] == 3 and stats["searches"] == 1
    text = policy.user_text(policy.probes["probe_0"], slate_info(["10", "11", "12"], 3), 10)
    assert "Toy Story" not in text.split("Your last rounds:")[1]  # round 1 (item 1) fell out of memory
    assert 'You then searched for "war films"' in text
    assert "Round 3 (recommender) showed: Twelve Monkeys (1995), (Drama, Sci-Fi)" in text  # item 7 + tags
    assert "Round 4 of 10" in text


@pytest.mark.llm
def test_population_of_small_llm_probes_runs_three_rounds(ml100k, smol, personas, pop_rec):
    meter = TokenMeter()
    env = PopulationEnv(pop_rec, n_agents=3, target="War", budget=3, token_meter=meter)
    trace = play_population(env, Population(tuple(personas[:3])), seed=0, target=("War",), llm=smol,
                            meter=meter)
    assert [len(p.tokens_per_round) for p in trace.probes] == [3] * 3
    for probe, persona in zip(trace.probes, personas[:3]):
        assert probe.probe_id == persona.probe_id
        assert probe.stats["decisions"] == len(probe.rounds) == 3
        replies = [r["reply"] for r in probe.rounds]
        assert probe.stats["parse_failures"] == sum(not usable_decision(text, 3) for text in replies)
        assert probe.tokens_per_round[-1] == meter.usage(persona.probe_id).total_tokens > 0
        shown = {str(ml100k.item_ids[i]) for s in env.probes[probe.agent].record.slates for i in s}
        assert {i for r in probe.likes_per_round for i in r} <= shown  # likes only from slates it saw
    assert meter.usage("probe_0").total_tokens == 0  # keyed by probe id, never by slot


@pytest.mark.llm
def test_cached_replay_gives_identical_trajectories_and_tokens(ml100k, smol, personas, pop_rec, tmp_path):
    smol.cache = ResponseCache(tmp_path / "responses.sqlite")
    try:
        runs = []
        for _ in range(2):
            meter = TokenMeter()
            env = PopulationEnv(pop_rec, n_agents=3, target="War", budget=3, token_meter=meter)
            cached_before = smol.meter.total.cached_calls
            trace = play_population(env, Population(tuple(personas[:3])), seed=5, target=("War",), llm=smol,
                                    meter=meter)
            runs.append((trace.to_dict(), smol.meter.total.cached_calls - cached_before))
        assert runs[0][0] == runs[1][0]
        assert runs[0][1] == 0 and runs[1][1] == 9  # second run: all 3 probes x 3 rounds from the cache
    finally:
        smol.cache.close()
        smol.cache = None


@pytest.mark.llm
def test_token_keys_survive_a_roster_swap(ml100k, smol, personas, pop_rec):
    meter = TokenMeter()
    env = PopulationEnv(pop_rec, n_agents=3, target="War", budget=1, token_meter=meter)
    first = play_population(env, Population(tuple(personas[:3])), seed=0, llm=smol, meter=meter)
    spent = {p.probe_id: p.tokens_per_round[-1] for p in first.probes}
    # The third probe moves to slot 0; a newcomer takes slot 1 (the second probe's old slot).
    second = play_population(env, Population((personas[2], personas[3])), seed=0, llm=smol, meter=meter)
    moved, newcomer = second.probes
    assert moved.agent == "probe_0" and newcomer.agent == "probe_1"
    assert moved.tokens_per_round[-1] > spent[personas[2].probe_id]  # kept its earlier tokens, added more
    assert 0 < newcomer.tokens_per_round[-1] < spent[personas[2].probe_id] + 1000
    assert meter.usage(personas[1].probe_id).total_tokens == spent[personas[1].probe_id]  # untouched
    assert meter.usage(personas[3].probe_id).total_tokens == newcomer.tokens_per_round[-1]


@pytest.mark.llm
def test_a_probe_whose_prompt_is_beyond_the_context_is_dropped_and_the_others_go_on(ml100k, smol, personas,
                                                                                    pop_rec):
    huge = Persona.from_dict({**personas[1].to_dict(), "bio": "noir " * 6000})  # beyond the 4k context
    meter = TokenMeter()
    env = PopulationEnv(pop_rec, n_agents=3, target="War", budget=2, token_meter=meter)
    trace = play_population(env, Population((personas[0], huge, personas[2])), seed=0, llm=smol, meter=meter)
    ok, dropped, ok2 = trace.probes
    assert dropped.dropped is not None and dropped.dropped_round == 1
    assert dropped.dropped.startswith("LLM call failed: PromptTooLongError: ")
    assert env.failures["probe_1"] == dropped.dropped
    assert ok.dropped is None and ok2.dropped is None
    assert ok.stats["decisions"] == ok2.stats["decisions"] == 2


def test_append_mode_grows_the_conversation_by_turns_and_restarts_after_append_rounds(ml100k, personas):
    settings = DecisionSettings(conversation="append", append_rounds=2, memory_rounds=1)
    policy = LLMPopulationPolicy(None, ml100k, {"probe_0": personas[0]}, target=["War"], settings=settings)
    slates = [["1", "2", "3"], ["4", "5", "6"], ["7", "8", "9"]]
    replies = ['{"like": [1], "search": ""}', '{"like": [], "search": ""}', '{"like": [3], "search": ""}']
    convs = []
    for n, (ids, reply) in enumerate(zip(slates, replies)):
        conv = policy.conversation("probe_0", slate_info(ids, n), 3, 10)
        policy._decide("probe_0", reply, slate_info(ids, n), 3)
        policy._append_turn("probe_0", conv, reply)
        convs.append(conv)
    first, second, third = convs
    assert second[:2] == first  # the earlier prompt is a prefix of the next: only new turns follow
    assert second[2] == {"role": "assistant", "content": replies[0]}
    assert second[3]["content"].startswith("Round 2 of 10. The website now shows (recommender):\n1. ")
    assert personas[0].bio not in second[3]["content"]  # the persona is not repeated
    # After append_rounds (2) rounds the conversation starts again as a memory-style prompt.
    assert len(third) == 2 and personas[0].bio in third[1]["content"]
    assert "Round 2 (recommender) showed:" in third[1]["content"]  # the last M=1 rounds, summarised
    memory = LLMPopulationPolicy(None, ml100k, {"probe_0": personas[0]}, target=["War"])
    assert len(memory.conversation("probe_0", slate_info(slates[0], 0), 3, 10)) == 2


@pytest.mark.llm
@pytest.mark.slow  # 80 s on 2 cores with AVX-512 kernels; keeps the default suite under 15 minutes
def test_append_mode_evaluates_far_fewer_prompt_tokens_per_decision(ml100k, smol, personas, pop_rec):
    evaluated = {}
    before, smol.kv_reuse = smol.kv_reuse, True  # append rounds gain only with KV reuse across calls
    for mode in ("memory", "append"):
        smol.reset_kv()
        env = PopulationEnv(pop_rec, n_agents=4, target="War", budget=4)
        start = smol.evaluated_tokens
        trace = play_population(env, Population(tuple(personas)), seed=0, target=("War",), llm=smol,
                                settings=DecisionSettings(conversation=mode))
        decisions = sum(p.stats["decisions"] for p in trace.probes)
        assert decisions == 16
        evaluated[mode] = (smol.evaluated_tokens - start) / decisions
    smol.kv_reuse = before
    # 4 probes x 4 rounds on the 135M model: the first round costs both modes the same, so the
    # saving is smaller than over 8 rounds of 16 probes (0.30 there on qwen2.5-0.5b,
    # benchmarks/llm_probe_throughput.py); trajectories differ between the modes.
    assert evaluated["append"] < 0.8 * evaluated["memory"], evaluated
