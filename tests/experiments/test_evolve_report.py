"""`ctrlsim evolve`'s tables (as data, rendered to GitHub markdown) and the probes' own failure rate."""
from ctrlsim.experiments.evolve.report import probe_failures_line, render_tables
from ctrlsim.experiments.tables import markdown_tables, render_markdown, report_tables


class _Config:
    agents, merges, rounds_per_merge, k_rule, fusion = 4, 1, 1, "halve", "debate-merge"
    target, llm, recommender = ("War",), "smollm2-135m", "popularity"


def test_failure_line_counts_by_hand():
    probes = [{"stats": {"decisions": 4, "parse_failures": 1}, "dropped": None},
              {"stats": {"decisions": 2, "parse_failures": 0}, "dropped": "LLMOutputError: ..."}]
    assert probe_failures_line(probes) == ("Probe failures: 1 of 6 decisions unparseable (16.7%, skipped "
                                           "rounds); 1 of 2 probes dropped\n")
    assert "(-, skipped rounds); 0 of 0" in probe_failures_line([])


def test_tables_are_data_and_render_as_markdown():
    generations = [{"generation": 0, "probes": 4, "k": 2, "silhouette": 0.25, "sizes": [3, 1],
                    "next_probes": 2, "invalid_merges": 0}]
    phases = {"profiles": {"seconds": 1.5, "tokens": {"total_tokens": 10, "calls": 2}}}
    evaluation = {"rounds": 2, "probes": 2, "prompt_variant": "default", "new_discoveries": [1, 0],
                  "curves": {"coverage": [0.1, 0.2], "efficiency": [1.0, 2.0], "len": [1.0, 1.5],
                             "tokens": [10.0, 20.0]},
                  "interaction_popularity": 50.0, "catalogue_popularity": 40.0,
                  "trace": {"probes": [{"stats": {"decisions": 2, "parse_failures": 0}, "dropped": None}]}}
    blocks = render_tables(_Config(), generations, phases, evaluation)
    tables = report_tables(blocks)
    assert list(tables["Generations"]["probes"]) == [4]
    cost = tables["Cost per phase (wall seconds of the run that finished the phase)"]
    assert list(cost["tokens"]) == [10, 10]  # the phase, then the total
    assert list(cost["LLM calls"]) == [2, 2]
    evaluation_table = tables["Evaluation of the 2 super probes (default prompt)"]
    assert list(evaluation_table["Cov. %"]) == ["20.00"]  # 100 * coverage[t = 2]
    # tabulate reads evolve's number-like cells as numbers: "20.00" renders as 20, right-aligned.
    shown = markdown_tables(render_markdown(blocks))
    assert list(shown["Evaluation of the 2 super probes (default prompt)"]["Cov. %"]) == [20.0]
    assert "|   t |   Cov. % |" in render_markdown(blocks)
