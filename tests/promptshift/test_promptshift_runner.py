"""The Tables 4-6 runner: incremental records, resume without regenerating anything, table layout."""
import json

import pytest

from ctrlsim.envs.promptshift_env import PromptShiftData
from ctrlsim.errors import ConfigError
from ctrlsim.experiments.promptshift_tables import (
    PromptShiftRunConfig,
    format_tables,
    main,
    run,
    sample_users,
)

pytestmark = pytest.mark.llm


def fresh_calls(llm):
    usage = llm.meter.total
    return usage.calls - usage.cached_calls


def test_stratified_sample(ml100k):
    data = PromptShiftData.build(ml100k)
    users = sample_users(data, 6, seed=0)
    assert len(users) == len(set(users)) == 6 and set(users) <= set(data.eligible)
    strata = {data.slice_of(u, "gender_age") for u in users}
    assert len(strata) == 6  # one per gender-age slice
    assert sample_users(data, 6, seed=0) == users and sample_users(data, 6, seed=1) != users
    assert len(sample_users(data, 40, seed=0)) == 40


def test_resume_regenerates_nothing(smol, tmp_path):
    out = tmp_path / "ps.jsonl"
    cfg = PromptShiftRunConfig(llms=("smollm2-135m",), n_users=2, scenarios=("gender", "age"), n_candidates=5,
                               k=4, max_tokens=72, out=str(out))
    llms = {"smollm2-135m": smol}

    # "Interrupted" after one user: its lists (L^0, P1-P3, two cues) and records are on disk.
    before = fresh_calls(smol)
    partial = run(cfg, llms=llms, stop_after_users=1, show_progress=False)
    assert fresh_calls(smol) - before == 6 and not partial["complete"]
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 3  # config, controls, gender, age
    first_user = json.loads(lines[1])["key"].split("/")[1]

    # The rerun does only the second user; the first user's lines stay as they were.
    before = fresh_calls(smol)
    result = run(cfg, llms=llms, show_progress=False)
    assert fresh_calls(smol) - before == 6 and result["complete"]
    lines2 = out.read_text().splitlines()
    assert lines2[:4] == lines and len(lines2) == 7
    assert {json.loads(l)["key"].split("/")[1] for l in lines2[1:]} == set(result["users"])
    assert first_user in result["users"]

    # A user cut off mid-way (its last scenario line lost) costs exactly that one cued list.
    out.write_text("\n".join(lines2[:-1]) + "\n")
    before = fresh_calls(smol)
    again = run(cfg, llms=llms, show_progress=False)
    assert fresh_calls(smol) - before == 1
    # Nothing left to do: no LLM call at all, and the same tables.
    before = fresh_calls(smol)
    final = run(cfg, llms=llms, show_progress=False)
    assert fresh_calls(smol) == before
    assert final["settings"] == again["settings"]

    setting = final["settings"][0]
    assert setting["n_users"] == 2 and setting["n_records"] == 4
    t4 = setting["table4"]
    assert t4["delta_d"] == pytest.approx(t4["cue_drift"] - t4["paraphrase_drift"])
    assert t4["cue_drift"] == pytest.approx(setting["variants"]["B0"]["drift"])
    assert 0 <= t4["paraphrase_drift"] <= 1 and setting["tokens"]["completion_tokens"] > 0
    assert final["table6"]["B3"] == setting["variants"]["B3"]  # one setting: macro mean = its means
    text = format_tables(final)
    for head in ("Table 4", "Table 5", "Table 6", "Paraphrase Drift", "SliceShift", "Difficulty@4",
                 "PromptShift", "All-user-fixed", "smollm2-135m", "MovieLens 100K"):
        assert head in text

    # Choosing B3's parameters on the validation split reuses the stored lists: still no LLM call.
    selected = run(PromptShiftRunConfig(**{**cfg.to_dict(), "select_on_validation": True, "out": str(out)}),
                   llms=llms, show_progress=False)
    assert fresh_calls(smol) == before
    sel = selected["settings"][0]["selection"]
    assert len(sel["grid"]) == 27 and set(sel["chosen"]) == set(sel["paper"])
    for v in ("B0", "B1", "B2"):  # selection tunes B3 only
        assert selected["settings"][0]["variants"][v] == setting["variants"][v]
    assert "Validation-selected" in format_tables(selected)

    # A changed config never mixes into an existing result file.
    with pytest.raises(ConfigError):
        run(PromptShiftRunConfig(**{**cfg.to_dict(), "k": 3, "out": str(out)}), llms=llms, show_progress=False)


def test_cli_parses_arguments(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cfg, **kw):
        seen["cfg"] = cfg
        return {"config": {**cfg.to_dict(), "out": cfg.out}, "settings": [], "complete": True,
                "table6": {v: {m: 0.0 for m in ("drift", "slice_shift", "difficulty@20", "hit_rate@20", "mrr@20",
                                                "ndcg@20")} for v in ("B0", "B1", "B2", "B3")}}

    monkeypatch.setattr("ctrlsim.experiments.promptshift_tables.run", fake_run)
    assert main(["--llm", "smollm2-135m", "--users", "3", "--out", str(tmp_path / "x.jsonl"), "--seed", "7"]) == 0
    cfg = seen["cfg"]
    assert cfg.llms == ("smollm2-135m",) and cfg.n_users == 3 and cfg.seed == 7 and cfg.k == 20
