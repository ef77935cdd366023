"""Independent draws per conversation, the merge's target-item rule, and the evolution cache.

No model is loaded: `ScriptedLLM` records the seed each conversation was sent with (and the meter
key it was charged to) and answers from a script, so the tests check what each probe, speaker or
cluster asks the LLM under, and what the merge makes of a reply.
"""
import json
from types import SimpleNamespace

import pytest
from ctrlsim.agents import DecisionSettings, LLMPopulationPolicy
from ctrlsim.agents.evolution import EvolutionLoop, EvolutionSettings
from ctrlsim.agents.evolution import methods as evo_methods
from ctrlsim.agents.evolution import prompts as loop_prompts
from ctrlsim.agents.evolution.artefacts import LOCK_FILE, ArtefactFolder, locked_folder
from ctrlsim.agents.evolution.debate import GenerationSettings, run_debate
from ctrlsim.agents.evolution.merge import FLAG_MERGE_FALLBACK, fuse_clusters
from ctrlsim.agents.persona import Persona
from ctrlsim.agents.profiles import ProfileGenerator, ProfileSettings
from ctrlsim.agents.prompts import domain_nouns

from ctrlsim import agents
from ctrlsim.backends.llm import Completion, per_conversation_seeds
from ctrlsim.errors import ConfigError, RunLockedError


class ScriptedLLM:
    """Records (meter key or conversation index, seed) per conversation; `reply(conv, key)` answers."""

    supports_json_schema = False

    def __init__(self, reply=lambda conv, key: '{"like": [], "search": ""}'):
        self.reply, self.sent = reply, []

    def chat(self, conversations, *, seed=None, keys=None, **kwargs):
        seeds = per_conversation_seeds(seed, len(conversations))
        keys = list(keys) if keys is not None else [None] * len(conversations)
        self.sent.append(list(zip(keys, seeds)))
        return [Completion(self.reply(c, k), 5, 5) for c, k in zip(conversations, keys)]

    def cache_identity(self):
        return "scripted:model"


def seeds_by_key(llm) -> dict:
    """Meter key -> the seed of its first conversation."""
    out: dict = {}
    for call in llm.sent:
        for key, seed in call:
            out.setdefault(key, seed)
    return out


# ----------------------------------------------------------------------------- decisions


@pytest.fixture(scope="module")
def personas(ml100k):
    gen = ProfileGenerator(ml100k, None)
    return [gen.template_persona(u, gen.seed_items(u, 0)) for u in ("1", "2", "3", "4")]


def decide(policy, agent_names, round_no=0):
    infos = {a: {"slate_item_ids": ["1", "2", "3"], "round": round_no, "slate_source": "recommender"}
             for a in agent_names}
    policy.act(dict.fromkeys(agent_names, {}), infos, slate_size=3, budget=5)
    return policy.llm.sent[-1]


def test_sampling_probes_get_their_own_seed_whatever_the_batch(ml100k, personas):
    agents_ = {f"probe_{n}": p for n, p in enumerate(personas)}
    sampled = DecisionSettings(temperature=1.0)
    full = LLMPopulationPolicy(ScriptedLLM(), ml100k, agents_, target=["War"], settings=sampled, seed=5)
    seeds = [s for _, s in decide(full, list(agents_))]
    assert len(set(seeds)) == len(personas)  # no two probes share their draws
    # Probe 2 alone, or with other company, or in another roster order: the same seed.
    alone = LLMPopulationPolicy(ScriptedLLM(), ml100k, {"x": personas[2]}, target=["War"], settings=sampled,
                                seed=5)
    assert [s for _, s in decide(alone, ["x"])] == [seeds[2]]
    mixed = LLMPopulationPolicy(ScriptedLLM(), ml100k, {"b": personas[3], "a": personas[2]}, target=["War"],
                                settings=sampled, seed=5)
    assert [s for _, s in decide(mixed, ["b", "a"])] == [seeds[3], seeds[2]]
    # Another round or another run seed draws anew.
    assert [s for _, s in decide(full, list(agents_), round_no=1)][2] != seeds[2]
    other = LLMPopulationPolicy(ScriptedLLM(), ml100k, agents_, target=["War"], settings=sampled, seed=6)
    assert [s for _, s in decide(other, list(agents_))][2] != seeds[2]


def test_greedy_probes_keep_one_seed_per_round(ml100k, personas):
    """At temperature 0 every probe of a round is sent the round's one int seed, as before."""
    from ctrlsim.seeding import derive_seed

    class IntSeedOnly(ScriptedLLM):
        def chat(self, conversations, *, seed=None, **kwargs):
            assert isinstance(seed, int), seed  # one int: the cache keys of replies stored before
            return super().chat(conversations, seed=seed, **kwargs)

    agents_ = {f"probe_{n}": p for n, p in enumerate(personas)}
    policy = LLMPopulationPolicy(IntSeedOnly(), ml100k, agents_, target=["War"], seed=5)
    assert {s for _, s in decide(policy, list(agents_), round_no=2)} == {derive_seed(5, "decision-round", 2)}


# ----------------------------------------------------------------------------- debate, merge, profiles


def member(pid, behaviour):
    return Persona(probe_id=pid, name=pid.upper(), bio="A viewer who likes old films.",
                   interests=("drama",), behaviour=tuple(behaviour))


@pytest.fixture(scope="module")
def clusters(ml100k):
    noir = ml100k.items_with_tag("Film-Noir")[:2]
    plain = [i for i in ml100k.item_ids if i not in set(ml100k.items_with_tag("Film-Noir"))][:6]
    groups = [[member("a", [plain[0], noir[0]]), member("b", [plain[1]])],
              [member("c", [plain[2], noir[1]]), member("d", [plain[3]])],
              [member("e", [plain[4], plain[5]])]]
    return groups, set(noir), plain


def test_debate_turns_sample_with_their_own_seed_alone_or_batched(ml100k, clusters):
    groups, _, _ = clusters
    nouns = domain_nouns(ml100k.name)
    sampled = GenerationSettings(max_tokens=20, temperature=0.7, seed=11)
    llm = ScriptedLLM(lambda conv, key: "I like noir.")
    run_debate(llm, groups, ml100k, nouns, sampled)
    assert [len(call) for call in llm.sent] == [4, 4]  # two batched rounds over both debating clusters
    round1, round2 = ([s for _, s in call] for call in llm.sent)
    assert len(set(round1 + round2)) == 8  # every turn its own draw
    alone = ScriptedLLM(lambda conv, key: "I like noir.")
    run_debate(alone, [groups[1]], ml100k, nouns, sampled)
    assert [s for _, s in alone.sent[0]] == round1[2:] and [s for _, s in alone.sent[1]] == round2[2:]
    greedy = ScriptedLLM(lambda conv, key: "I like noir.")
    run_debate(greedy, groups, ml100k, nouns, GenerationSettings(temperature=0.0, seed=11))
    assert {s for call in greedy.sent for _, s in call} == {11}  # greedy: the one seed, as before


def merge_reply(items):
    return json.dumps({"name": "Club", "bio": "Fans of old crime films.", "interests": ["crime"],
                       "behaviour": list(items)})


def fuse(ml100k, clusters, llm, *, force=False, settings=None):
    groups, targets, _ = clusters
    return fuse_clusters(llm, groups, [[], [], []], ml100k, target_tags=["Film-Noir"], target_items=targets,
                         recent_likes={}, new_ids=["g1-0", "g1-1", "g1-2"], nouns=domain_nouns(ml100k.name),
                         settings=settings, key_prefix="merge", force_target_items=force)


def dropping_targets(clusters):
    """Merges keep only the members' non-target items; cluster 1's merge is unusable twice."""
    groups, targets, _ = clusters

    def reply(conv, key):
        if key == "merge/g1-1":
            return "no json here"
        n = int(key.rsplit("-", 1)[1])
        kept = [i for p in groups[n] for i in p.behaviour if i not in targets]
        return merge_reply(kept) if len(groups[n]) > 1 else json.dumps({"behaviour": kept})

    return reply


def test_merge_keeps_what_the_model_kept_unless_forced(ml100k, clusters):
    groups, targets, plain = clusters
    default = fuse(ml100k, clusters, ScriptedLLM(dropping_targets(clusters)))
    assert default[0].valid and default[0].persona.behaviour == (plain[0], plain[1])  # no target added back
    assert all(o.added_target_items == () for o in default)
    assert not default[1].valid and FLAG_MERGE_FALLBACK in default[1].persona.flags  # the best member
    forced = fuse(ml100k, clusters, ScriptedLLM(dropping_targets(clusters)), force=True)
    noir_a = groups[0][0].behaviour[1]
    assert noir_a in targets and forced[0].added_target_items == (noir_a,)
    assert set(forced[0].persona.behaviour) == {plain[0], plain[1], noir_a}
    assert forced[2].added_target_items == ()  # the filtered singleton had no target item


def test_the_generation_summary_counts_added_target_items_and_merge_fallbacks(ml100k, clusters, tmp_path):
    groups, _, _ = clusters
    for force, added in ((False, 0), (True, 1)):
        folder = ArtefactFolder(tmp_path / f"force-{force}")
        outcomes = fuse(ml100k, clusters, ScriptedLLM(dropping_targets(clusters)), force=force)
        folder.write_json("clusters_g0.json", {"probe_ids": [p.probe_id for g in groups for p in g], "k": 3,
                                               "silhouette": None, "members": [[0, 1], [2, 3], [4]]})
        folder.write_json("merge_g0.json", {"generation": 0, "outcomes": [o.to_dict() for o in outcomes]})
        loop = EvolutionLoop(folder, dataset=ml100k, recommender=None, task=None, llm=None,
                             settings=EvolutionSettings(force_target_items=force))
        summary = loop.generation_summary(0)
        assert summary["target_items_added"] == added
        assert summary["merge_fallbacks"] == 1 and summary["invalid_merges"] == 1


def test_merges_sample_with_a_seed_per_cluster_alone_or_batched(ml100k, clusters):
    groups, targets, _ = clusters
    sampled = GenerationSettings(temperature=0.7, seed=3)
    llm = ScriptedLLM(dropping_targets(clusters))
    fuse(ml100k, clusters, llm, settings=sampled)
    seeds = seeds_by_key(llm)
    assert len({seeds["merge/g1-0"], seeds["merge/g1-1"], seeds["merge/g1-2"]}) == 3
    retry = llm.sent[1]  # cluster 1's retry: a draw of its own too
    assert [k for k, _ in retry] == ["merge/g1-1"] and retry[0][1] != seeds["merge/g1-1"]
    alone = ScriptedLLM(dropping_targets(clusters))
    fuse_clusters(alone, [groups[1]], [[]], ml100k, target_tags=["Film-Noir"], target_items=targets,
                  recent_likes={}, new_ids=["g1-1"], nouns=domain_nouns(ml100k.name), settings=sampled,
                  key_prefix="merge", schema_groups=groups)
    assert alone.sent[0] == [("merge/g1-1", seeds["merge/g1-1"])]  # the batched call's seed for it


def test_sampled_personas_get_a_seed_per_user(ml100k):
    reply = '{"name": "Ann", "bio": "Likes films a lot.", "interests": ["drama"]}'
    sampled = ProfileSettings(temperature=1.0)
    both = ScriptedLLM(lambda conv, key: reply)
    ProfileGenerator(ml100k, both, settings=sampled).generate(["1", "2"], seed=4)
    first = [s for _, s in both.sent[0]]
    assert len(set(first)) == 2
    alone = ScriptedLLM(lambda conv, key: reply)
    ProfileGenerator(ml100k, alone, settings=sampled).generate(["2"], seed=4)
    assert [s for _, s in alone.sent[0]] == [first[1]]
    greedy = ScriptedLLM(lambda conv, key: reply)
    ProfileGenerator(ml100k, greedy).generate(["1", "2"], seed=4)
    assert len({s for _, s in greedy.sent[0]}) == 1


# ----------------------------------------------------------------------------- evolution cache


def fake_context(tmp_path):
    return SimpleNamespace(
        dataset=SimpleNamespace(name="ml-100k"), recommender=SimpleNamespace(identity={"box": "popularity"}),
        target_tags=("Film-Noir",), seed=0, k_large=8, slate_size=3, llm=lambda: ScriptedLLM(),
        decision_settings=DecisionSettings(), profile_settings=ProfileSettings(), work_dir=tmp_path,
    )


def test_the_evolution_folder_changes_with_any_prompt_text_and_the_code_version(tmp_path, monkeypatch):
    context, settings = fake_context(tmp_path), EvolutionSettings()
    base = evo_methods.evolution_folder(context, settings, "minilm")
    assert evo_methods.evolution_folder(context, settings, "minilm") == base  # stable
    identity = json.loads((base / "identity.json").read_text())
    assert identity["code"]["evolution_format"] == evo_methods.EVOLUTION_FORMAT
    texts = evo_methods.prompt_texts()
    assert "ctrlsim.agents.evolution.prompts.MERGE_SYSTEM" in texts
    assert "ctrlsim.agents.prompts.DECISION_USER" in texts and list(texts) == sorted(texts)
    seen = {base}
    for module, name in ((loop_prompts, "MERGE_SYSTEM"), (agents.prompts, "DECISION_USER")):
        with monkeypatch.context() as patch:
            patch.setattr(module, name, getattr(module, name) + " Be brief.")
            seen.add(evo_methods.evolution_folder(context, settings, "minilm"))
    with monkeypatch.context() as patch:
        patch.setattr(evo_methods, "EVOLUTION_FORMAT", evo_methods.EVOLUTION_FORMAT + 1)
        seen.add(evo_methods.evolution_folder(context, settings, "minilm"))
    seen.add(evo_methods.evolution_folder(context, EvolutionSettings(force_target_items=True), "minilm"))
    assert len(seen) == 5
    assert evo_methods.evolution_folder(context, settings, "minilm") == base  # patches undone


def test_a_second_writer_of_an_evolution_folder_gets_a_typed_error(tmp_path):
    folder = tmp_path / "evo"
    with locked_folder(folder):
        with pytest.raises(RunLockedError, match=str(folder)):
            with locked_folder(folder):
                pass
    with locked_folder(folder):  # released at the end of the first `with`
        pass
    assert (folder / LOCK_FILE).read_bytes() == b""  # the lock file is never written


def test_a_planted_lock_symlink_is_refused_and_not_followed(tmp_path):
    folder, victim = tmp_path / "evo", tmp_path / "precious.txt"
    folder.mkdir()
    victim.write_text("keep me")
    (folder / LOCK_FILE).symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        with locked_folder(folder):
            pass
    assert victim.read_text() == "keep me"


def test_evolve_holds_the_folder_lock_while_the_loop_runs(ml100k, tmp_path, monkeypatch):
    seen = {}

    class LockProbe:
        def __init__(self, folder, **kwargs):
            self.folder = folder

        def run(self, initial):
            with pytest.raises(RunLockedError) as exc:
                with locked_folder(self.folder):
                    pass
            seen["error"] = str(exc.value)
            return SimpleNamespace(final=[member("z", ["1"])], tokens=0, unknown_calls=0,
                                   generations=[], phases={})

    monkeypatch.setattr(evo_methods, "EvolutionLoop", LockProbe)
    context = fake_context(tmp_path)
    context.recommender.dataset, context.options, context.show_progress = ml100k, {}, False
    population = evo_methods.evolve(context, fusion="debate-merge")
    assert population.artefacts["evolution_folder"] in seen["error"]
    with locked_folder(population.artefacts["evolution_folder"]):  # free again once evolve returns
        pass
