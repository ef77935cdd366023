"""The derived-output cache: tables and figures made once per exact inputs, read back byte for byte."""
from __future__ import annotations

import json

import pytest

from ctrlsim.errors import CacheCorruptionWarning
from ctrlsim.experiments import output_cache, provenance
from ctrlsim.experiments.runfolder import RunFolder, new_figure

INPUTS = {"records": [{"tag": "Horror", "delta_auc": 0.125}, {"tag": "Romance", "delta_auc": -0.5}]}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CTRLSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # no matplotlibrc of the repository's working folder
    return tmp_path / "cache" / "outputs"


class Maker:
    """Counts its calls; returns text made from the inputs."""

    def __init__(self, inputs):
        self.inputs, self.calls = inputs, 0

    def __call__(self) -> str:
        self.calls += 1
        rows = "".join(f"| {r['tag']} | {r['delta_auc']:+.3f} |\n" for r in self.inputs["records"])
        return "| tag | ΔAUC |\n" + rows


def test_text_is_made_once_per_inputs_and_read_back_exactly():
    make = Maker(INPUTS)
    first = output_cache.cached_text("t", INPUTS, make)
    assert first == "| tag | ΔAUC |\n| Horror | +0.125 |\n| Romance | -0.500 |\n"
    assert output_cache.cached_text("t", json.loads(json.dumps(INPUTS)), make) == first
    assert make.calls == 1
    other = {"records": INPUTS["records"][:1]}
    assert output_cache.cached_text("t", other, Maker(other)) == "| tag | ΔAUC |\n| Horror | +0.125 |\n"
    assert output_cache.cached_text("another kind", INPUTS, make) == first and make.calls == 2


def test_changed_code_or_library_versions_make_a_new_key(monkeypatch):
    before = output_cache.output_key("t", INPUTS, output_cache.TABLE_LIBRARIES)
    code = dict(provenance.code_version())
    monkeypatch.setattr(provenance, "code_version", lambda: {**code, "source_sha256": "0" * 64})
    assert output_cache.output_key("t", INPUTS, output_cache.TABLE_LIBRARIES) != before
    monkeypatch.setattr(provenance, "code_version", lambda: code)
    assert output_cache.output_key("t", INPUTS, output_cache.TABLE_LIBRARIES) == before
    monkeypatch.setattr(provenance, "library_version", lambda dist: "0.0-other")
    assert output_cache.output_key("t", INPUTS, output_cache.TABLE_LIBRARIES) != before


def test_inputs_that_are_not_json_are_never_cached():
    assert output_cache.output_key("t", {"x": object()}, ()) is None
    make = Maker(INPUTS)
    for _ in range(2):
        output_cache.cached_text("t", {"records": INPUTS["records"], "x": object()}, make)
    assert make.calls == 2


def test_a_damaged_entry_is_removed_and_made_again(private_cache):
    make = Maker(INPUTS)
    expected = output_cache.cached_text("t", INPUTS, make)
    (entry,) = private_cache.glob("*.json")
    stored = json.loads(entry.read_text())
    stored["files"]["text"]["sha256"] = "0" * 64
    entry.write_text(json.dumps(stored))
    with pytest.warns(CacheCorruptionWarning, match="does not match its sha256"):
        assert output_cache.cached_text("t", INPUTS, make) == expected
    assert make.calls == 2
    assert output_cache.cached_text("t", INPUTS, make) == expected and make.calls == 2  # rewritten


def draw(target) -> None:
    for name, height in (("bars", 0.125), ("other", -0.5)):
        fig, ax = new_figure((4, 3))
        ax.bar([0], [height])
        ax.set_title(name)
        target.save_figure(fig, name)


def test_figures_are_drawn_once_and_written_byte_for_byte(tmp_path):
    with RunFolder(tmp_path / "drawn", {"x": 1}) as folder:
        draw(folder)  # what the run folder holds without the cache
    expected = {p.name: p.read_bytes() for p in (tmp_path / "drawn" / "figures").glob("*.png")}
    assert set(expected) == {"bars.png", "other.png"}
    calls = []

    def counted(target):
        calls.append(1)
        draw(target)

    for out in ("first", "second"):
        with RunFolder(tmp_path / out, {"x": 1}) as folder:
            output_cache.cached_figures(folder, "f", INPUTS, counted)
        assert {p.name: p.read_bytes() for p in (tmp_path / out / "figures").glob("*.png")} == expected
    assert len(calls) == 1


def test_a_matplotlibrc_matplotlib_would_read_changes_the_figure_key(tmp_path, monkeypatch):
    before = output_cache.output_key("f", INPUTS, output_cache.FIGURE_LIBRARIES,
                                     extra=output_cache.matplotlib_settings())
    (tmp_path / "matplotlibrc").write_text("figure.facecolor: red\n")
    after = output_cache.output_key("f", INPUTS, output_cache.FIGURE_LIBRARIES,
                                    extra=output_cache.matplotlib_settings())
    assert after != before
    rc = tmp_path / "elsewhere.rc"
    rc.write_text("axes.grid: True\n")
    monkeypatch.setenv("MATPLOTLIBRC", str(rc))
    assert output_cache.matplotlib_settings()["rc"][str(rc)] is not None
