"""The SteerEval runner: values checked before any model loads, resumable runs, tag-free ranker input."""
import json
import re

import pytest
from ctrlsim.envs.steereval_env import SteerEvalEnv, eligible_users

import ctrlsim
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.config import RunOptions
from ctrlsim.experiments.steereval.config import SteerEvalConfig, open_choices
from ctrlsim.experiments.steereval.units import prepare_dataset


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was checked")

    import ctrlsim.backends as backends

    monkeypatch.setattr(backends, "load_llm", refuse)
    monkeypatch.setattr(backends, "load_encoder", refuse)


@pytest.mark.parametrize("flags, message", [
    (["--conditions", "bogus"], "unknown value(s) 'bogus'"),
    (["--conditions", "default,default"], "more than once: 'default'"),
    (["--users", "0"], "users"),
    (["--pool-size", "7"], "pool_size"),
    (["--min-ratings", "50"], "min_ratings"),
    (["--tags", "Horror,Nope"], "unknown tag(s) 'Nope'"),
    (["--descriptions", "/nonexistent/overviews.csv"], "/nonexistent/overviews.csv"),
])
def test_bad_values_fail_before_any_model_loads(flags, message, tmp_path, capsys, no_model_loads):
    from ctrlsim.experiments.cli import main

    assert main(["steereval", *flags, "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err


def test_config_round_trips_and_cli_defaults_are_the_dataclass_defaults():
    from ctrlsim.experiments.commands import parse_command
    from ctrlsim.experiments.config import config_from_dict, config_to_dict

    assert parse_command("steereval", [])[0] == SteerEvalConfig()
    cfg = SteerEvalConfig(tags=("Horror",), conditions=("default", "oracle"))
    assert config_from_dict(SteerEvalConfig, config_to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="links"):
        SteerEvalConfig(links="links.csv")
    assert set(open_choices(cfg)) >= {"item text", "ties", "LLM score", "system message", "Trigger filter"}


@pytest.mark.llm
def test_runner_writes_incrementally_and_resumes(tmp_path, monkeypatch, smol):
    cfg = SteerEvalConfig(llm="smollm2-135m", users=1, tags=("Horror",), pool_size=6, history_len=8,
                            conditions=("default", "embedding"))
    options = RunOptions(out=str(tmp_path / "se"))
    first = ctrlsim.run("steereval", config=cfg, options=options, llms={cfg.llm: smol},
                        show_progress=False, raise_on_failure=False)
    assert len(first.summary["records"]) == 4  # 2 conditions x 2 directions
    records_file = tmp_path / "se" / "records.jsonl"
    lines = records_file.read_text().splitlines()
    assert json.loads(lines[0])["config"]["llm"] == "smollm2-135m" and len(lines) == 5
    assert (tmp_path / "se" / "figures" / "delta_auc_per_condition.png").stat().st_size > 0
    assert "Table 1" in (tmp_path / "se" / "tables.md").read_text()
    # an interrupted run: only the first record was written; a rerun computes the other three
    records_file.write_text("\n".join(lines[:2]) + "\n")
    calls = []
    real_step = SteerEvalEnv.step
    monkeypatch.setattr(SteerEvalEnv, "step", lambda self, a: calls.append(1) or real_step(self, a))
    second = ctrlsim.run("steereval", config=cfg, options=options, llms={cfg.llm: smol},
                         show_progress=False, raise_on_failure=False)
    assert len(calls) == 3 and len(second.summary["records"]) == 4
    # summed from the records, and the resumed unit pays only its own work: the same totals
    assert second.summary["tokens"] == first.summary["tokens"] and first.summary["tokens"]["total_tokens"] > 0
    assert {r["condition"] for r in second.summary["records"]} == {"default", "embedding"}


def _tag_outside_titles(text: str, tag: str, titles: list[str]) -> bool:
    """Does `tag` occur in `text` other than inside one of the item titles?"""
    for title in titles:
        text = text.replace(title, "")
    return re.search(re.escape(tag), text, re.I) is not None


@pytest.mark.llm
@pytest.mark.parametrize("ranker", ["llm", "embedding"])
def test_no_ranker_input_names_the_steered_tag_outside_the_oracle(ml100k, smol, minilm, ranker, monkeypatch):
    from ctrlsim.recommenders.prompts import profile_messages

    seen: list[str] = []
    real_rate, real_encode = smol.rate, minilm.encode
    monkeypatch.setattr(smol, "rate", lambda convs, **kw: seen.extend(c[-1]["content"] for c in convs)
                        or real_rate(convs, **kw))
    monkeypatch.setattr(minilm, "encode", lambda texts, **kw: seen.extend(texts) or real_encode(texts, **kw))
    titles = ml100k.items["title"].tolist()
    user = eligible_users(ml100k)[1]
    profile = "The user enjoys witty, fast-paced stories."
    for oracle, show_tags in ((False, False), (True, False), (False, True)):
        env = SteerEvalEnv(dataset=ml100k, llm=smol, encoder=minilm, ranker=ranker, pool_size=6,
                           tags=["Horror", "Comedy"], oracle=oracle, show_tags=show_tags)
        for tag in ("Horror", "Comedy"):
            sc = env.build(user, tag, "decrease")
            seen.clear()
            env.rank(profile, sc)  # exactly what step() ranks, for a fixed profile
            item_inputs = [t.split("CANDIDATE MOVIE:")[-1] for t in seen if t != profile]
            assert len(item_inputs) == len(sc.pool)
            # the profile writer's input: the same item blocks the recommender sends
            rec = env.recommender(tag)
            history = [rec.dataset.items.iloc[i] for i in rec.dataset.indices(sc.history)]
            profile_prompt = profile_messages(history, sc.ratings, "paragraph", show_tags=rec.show_tags)[-1]
            inputs = [*item_inputs, profile_prompt["content"]]
            leaks = [t for t in inputs if _tag_outside_titles(t, tag, titles)]
            if oracle:
                assert all(f"about: {tag}." in t for t in item_inputs)
            elif show_tags:
                assert leaks  # the named leaky variant does show tags
            else:
                assert leaks == []


def test_side_tables_attach_descriptions_and_renamed_trigger_tags(tmp_path, ml100k):
    ids = list(ml100k.item_ids[:4])
    descriptions = tmp_path / "overviews.csv"
    descriptions.write_text("item_id,overview\n" + "".join(f"{i},Plot of item {i}.\n" for i in ids))
    votes = tmp_path / "ddd.csv"
    votes.write_text("item_id,topic,yes,no\n"
                     f"{ids[0]},Does the dog die?,8,1\n"     # 89% yes: applies
                     f"{ids[1]},Does the dog die?,3,1\n"     # 75%: not above the threshold
                     f"{ids[2]},Is there cannibalism?,4,0\n")
    cfg = SteerEvalConfig(descriptions=str(descriptions), trigger_votes=str(votes),
                            tags=("Does the dog die?", "Is there cannibalism?", "Horror"))
    ds, tags, phrases, items = prepare_dataset(cfg)
    assert phrases == {"Does the dog die?": "the dog dies", "Is there cannibalism?": "there is cannibalism",
                       "Horror": "Horror"}
    assert set(ds.items_with_tag("Does the dog die?")) == {ids[0]}
    assert items == frozenset(ids)  # only described items are used (the paper drops the others)
    keep_all = SteerEvalConfig(descriptions=str(descriptions), drop_undescribed=False)
    assert prepare_dataset(keep_all)[3] is None
    kept_names = prepare_dataset(SteerEvalConfig(trigger_votes=str(votes), rename_triggers=False,
                                                     tags=("Does the dog die?",)))[2]
    assert kept_names == {"Does the dog die?": "Does the dog die?"}


@pytest.mark.llm
@pytest.mark.slow
def test_ray_executor_gives_the_local_records_and_tokens(tmp_path, smol, monkeypatch):
    """Units on two Ray workers: the same records (figures and token counts) as the in-process loop.

    The two directions of one user share a profile and an original ranking, which the increase unit
    owns; on Ray the decrease unit may compute them first on another worker, and must still not be
    charged for them, nor leave the owner at 0 tokens.
    """
    from ctrlsim.errors import MissingDependencyError

    try:
        from ctrlsim.experiments._ray_executor import import_ray

        ray = import_ray()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    # Bit-identical records need every call's result to depend on that call alone: the `exact`
    # runtime profile (KV reuse off), which the spec carries to every worker. With reuse on, a unit
    # whose shared profile came from the cache holds another KV state than one that wrote it, and
    # the two executors agree up to batching noise (docs/scale-out.md).
    cfg = SteerEvalConfig(llm="smollm2-135m@exact", users=2, tags=("Horror",), pool_size=10, history_len=8,
                            conditions=("default",))
    local = ctrlsim.run("steereval", config=cfg, options=RunOptions(out=str(tmp_path / "local")),
                        show_progress=False, raise_on_failure=False)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        remote = ctrlsim.run("steereval", config=cfg,
                             options=RunOptions(out=str(tmp_path / "ray"), executor="ray"),
                             show_progress=False, raise_on_failure=False)
    finally:
        ray.shutdown()
    assert remote.failed == {}

    def by_key(result):
        return {f"{r['condition']}/{r['user']}/{r['tag']}/{r['direction']}": r
                for r in result.summary["records"]}

    assert len(local.summary["records"]) == 4  # 2 users x 2 directions
    assert by_key(remote) == by_key(local)
    assert remote.summary["tokens"] == local.summary["tokens"]
    for user in {r["user"] for r in local.summary["records"]}:
        increase, decrease = (by_key(local)[f"default/{user}/Horror/{d}"]["tokens"]["prompt"]
                              for d in ("increase", "decrease"))
        assert increase > decrease > 0  # the increase unit pays for the shared profile and ranking


def test_a_loaded_llm_is_refused_with_the_ray_executor(tmp_path):
    cfg = SteerEvalConfig(users=1, tags=("Horror",), pool_size=6, history_len=8, conditions=("default",))
    with pytest.raises(ConfigError, match="--executor local"):
        ctrlsim.run("steereval", config=cfg, options=RunOptions(out=str(tmp_path / "se"), executor="ray"),
                    llms={cfg.llm: object()}, show_progress=False, raise_on_failure=False)
