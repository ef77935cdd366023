"""Side tables: descriptions (direct or TMDb via links.csv), vote-based and score-based tags."""
from __future__ import annotations

from pathlib import Path

import pytest

from ctrlsim.data import (
    Dataset,
    attach_descriptions,
    attach_tag_scores,
    attach_tag_votes,
    load_movielens_csv,
)
from ctrlsim.errors import DataError

# A slice of a TMDb movies export (tmdb_5000_movies.csv has these among many more columns).
TMDB = (
    "budget,id,original_title,overview,popularity\n"
    '30000000,862,Toy Story,"Led by Woody, Andy\'s toys live happily in his room until Andy\'s birthday '
    'brings Buzz Lightyear onto the scene.",21.946943\n'
    '10000000,194,Le Fabuleux Destin d\'Amélie Poulain,"At a tiny Parisian café, the adorable yet painfully '
    'shy Amélie accidentally discovers a gift for helping others.",19.2\n'
    "62000000,9087.0,The American President,Widowed U.S. president Andrew Shepherd can have anything "
    "he wants.,10.1\n"
    "1000,999999,Not In MovieLens,This film is not in links.csv.,0.1\n"
    "0,,Missing Id,A row without an id must not attach to anything.,0.0\n"
    "0,101765,La cravate,,0.0\n"
)

GENOME_TAGS = "tagId,tag\n1,007\n2,pixar animation\n3,politics\n4,paris\n"
GENOME_SCORES = (
    "movieId,tagId,relevance\n"
    "1,1,0.02875\n"
    "1,2,0.99925\n"
    "1,3,0.04\n"
    "1,4,0.1\n"
    "11,2,0.03\n"
    "11,3,0.91\n"
    "4973,1,0.5\n"
    "4973,4,0.97\n"
    "99999,2,0.9\n"
)


@pytest.fixture
def ml25m(ml25m_dir: Path) -> Dataset:
    return load_movielens_csv(ml25m_dir)


def desc_of(ds: Dataset) -> dict:
    return dict(zip(ds.items["item_id"], ds.items["description"]))


# ---------------------------------------------------------------- descriptions
def test_descriptions_direct_table(ml100k: Dataset, tmp_path: Path):
    table = tmp_path / "plots.csv"
    table.write_text(
        "item_id,description\n"
        '1,"A cowboy doll is threatened by a new spaceman figure, Buzz."\n'
        "50,Luke Skywalker joins the Rebellion.\n"
        "99999,Not in the catalogue.\n"
        "2,\n"
    )
    out = attach_descriptions(ml100k, table)
    assert out is not ml100k
    items = out.items.set_index("item_id")
    assert items.loc["1", "description"] == "A cowboy doll is threatened by a new spaceman figure, Buzz."
    assert items.loc["1", "text"] == ("Toy Story (1995), (Animation, Children's, Comedy). "
                                      "A cowboy doll is threatened by a new spaceman figure, Buzz.")
    assert items.loc["50", "text"].endswith(". Luke Skywalker joins the Rebellion.")
    # Items without a description keep their plain text.
    assert items.loc["2", "description"] == ""
    assert items.loc["2", "text"] == ml100k.item("2")["text"]
    assert (out.items["description"] != "").sum() == 2
    assert out.source["descriptions"] == str(table)
    # The input dataset is unchanged.
    assert "description" not in ml100k.items.columns
    assert "descriptions" not in ml100k.source
    assert ml100k.item("1")["text"] == "Toy Story (1995), (Animation, Children's, Comedy)"
    # Everything else is shared/unchanged.
    assert out.interactions is ml100k.interactions
    assert len(out.items) == len(ml100k.items)
    assert out.items["popularity"].equals(ml100k.items["popularity"])


def test_descriptions_tsv_and_explicit_column(ml25m: Dataset, tmp_path: Path):
    table = tmp_path / "plots.tsv"
    table.write_text("movieId\tsynopsis\n11\tA widowed president falls for a lobbyist.\n")
    out = attach_descriptions(ml25m, table, text_column="synopsis")
    assert desc_of(out)["11"] == "A widowed president falls for a lobbyist."


def test_descriptions_via_tmdb_links(ml25m: Dataset, ml25m_dir: Path, tmp_path: Path):
    tmdb = tmp_path / "tmdb_5000_movies.csv"
    tmdb.write_text(TMDB, encoding="utf-8")
    out = attach_descriptions(ml25m, tmdb, links=ml25m_dir / "links.csv")
    desc = desc_of(out)
    assert desc["1"].startswith("Led by Woody, Andy's toys live happily")
    assert desc["4973"].startswith("At a tiny Parisian café")
    assert desc["11"] == "Widowed U.S. president Andrew Shepherd can have anything he wants."  # "9087.0" id
    # Movies without a tmdbId in links.csv get nothing -- in particular not the
    # overview of the TMDb row whose id is missing.
    assert desc["2338"] == "" and desc["40697"] == ""
    assert desc["114335"] == ""  # TMDb row exists but its overview is empty
    assert sum(d != "" for d in desc.values()) == 3
    assert out.items.set_index("item_id").loc["4973", "text"] == (
        "Amélie (Fabuleux destin d'Amélie Poulain, Le) (2001), (Comedy, Romance). " + desc["4973"])


def test_descriptions_first_row_wins_for_duplicates(ml25m: Dataset, tmp_path: Path):
    table = tmp_path / "d.csv"
    table.write_text("movieId,overview\n1,First.\n1,Second.\n")
    assert desc_of(attach_descriptions(ml25m, table))["1"] == "First."


# ------------------------------------------------------------------ tag votes
def test_tag_votes_threshold(ml25m: Dataset, tmp_path: Path):
    votes = tmp_path / "dtdd.csv"
    votes.write_text(
        "item_id,tag,yes,no\n"
        "1,a dog dies,3,1\n"            # 3/4 = 0.75: not above the threshold
        "11,a dog dies,4,1\n"           # 4/5 = 0.80: relevant
        "1,someone is sick,0,0\n"       # no votes: not relevant
        "4973,someone is sick,5,0\n"    # 5/5: relevant
        "40697,someone is sick,1,0\n"   # 1/1: relevant
        "99999,a dog dies,10,0\n"       # not in the catalogue: ignored
    )
    out = attach_tag_votes(ml25m, votes)
    assert out.items_with_tag("a dog dies") == ["11"]
    assert out.items_with_tag("a dog dies", kind="trigger") == ["11"]
    assert out.items_with_tag("someone is sick", kind="trigger") == ["4973", "40697"]
    assert "1" not in out.items_with_tag("a dog dies")
    assert "99999" not in set(out.item_tags["item_id"])
    trig = out.item_tags[out.item_tags["kind"] == "trigger"]
    assert sorted(map(tuple, trig[["item_id", "tag"]].to_numpy())) == [
        ("11", "a dog dies"), ("40697", "someone is sick"), ("4973", "someone is sick")]
    assert "a dog dies" in out.tags and "someone is sick" in out.tags
    items = out.items.set_index("item_id")
    # Triggers are appended after the genres in items.tags and the item text.
    assert items.loc["11", "tags"] == ("Comedy", "Drama", "Romance", "a dog dies")
    assert items.loc["11", "text"] == "American President, The (1995), (Comedy, Drama, Romance, a dog dies)"
    assert items.loc["1", "tags"] == ml25m.items.set_index("item_id").loc["1", "tags"]
    assert out.source["trigger_tags"] == {"path": str(votes), "threshold": 0.75}
    # Genre tags are still there with their own kind.
    assert out.items_with_tag("Comedy", kind="genre") == ml25m.items_with_tag("Comedy")
    assert out.items_with_tag("Comedy", kind="trigger") == []
    # The input is unchanged.
    assert "a dog dies" not in ml25m.tags
    with pytest.raises(DataError):
        ml25m.items_with_tag("a dog dies")
    assert "trigger_tags" not in ml25m.source


def test_tag_votes_lower_threshold_and_kind(ml25m: Dataset, tmp_path: Path):
    votes = tmp_path / "dtdd.csv"
    votes.write_text("item_id,tag,yes,no\n1,a dog dies,3,1\n11,a dog dies,1,1\n")
    out = attach_tag_votes(ml25m, votes, threshold=0.5, kind="warning")
    assert out.items_with_tag("a dog dies", kind="warning") == ["1"]
    assert out.items_with_tag("a dog dies", kind="trigger") == []
    assert set(out.item_tags["kind"]) == {"genre", "warning"}


def test_tag_votes_via_tmdb_links_tsv(ml25m: Dataset, ml25m_dir: Path, tmp_path: Path):
    # DoesTheDogDie exports are keyed by TMDb id, with topic names and vote sums.
    votes = tmp_path / "dtdd.tsv"
    votes.write_text(
        "tmdbId\ttopic\tyesSum\tnoSum\n"
        "862\ta kid dies\t0\t12\n"
        "194\tsomeone is sick\t9\t1\n"
        "9087\tsomeone is sick\t3\t1\n"
        "5555\ta dog dies\t40\t0\n"
    )
    out = attach_tag_votes(ml25m, votes, links=ml25m_dir / "links.csv")
    assert out.items_with_tag("someone is sick", kind="trigger") == ["4973"]
    assert "a kid dies" not in out.tags and "a dog dies" not in out.tags


def test_tag_votes_can_be_stacked(ml25m: Dataset, tmp_path: Path):
    first = tmp_path / "a.csv"
    first.write_text("item_id,tag,yes,no\n1,a dog dies,9,1\n")
    second = tmp_path / "b.csv"
    second.write_text("item_id,tag,yes,no\n1,a dog dies,9,1\n1,jump scares,9,0\n")
    out = attach_tag_votes(attach_tag_votes(ml25m, first), second)
    assert out.items.set_index("item_id").loc["1", "tags"][-2:] == ("a dog dies", "jump scares")
    assert len(out.item_tags[(out.item_tags["item_id"] == "1") & (out.item_tags["tag"] == "a dog dies")]) == 1


def test_tag_votes_on_ml100k(ml100k: Dataset, tmp_path: Path):
    votes = tmp_path / "dtdd.csv"
    votes.write_text("item_id,tag,yes,no\n1,a toy is destroyed,4,1\n50,a planet is destroyed,3,1\n")
    out = attach_tag_votes(ml100k, votes)
    assert out.items_with_tag("a toy is destroyed") == ["1"]
    assert "a planet is destroyed" not in out.tags
    assert len(out.tags) == 20
    assert len(ml100k.tags) == 19


# ----------------------------------------------------------------- tag scores
def test_tag_scores_with_genome_tags(ml25m: Dataset, tmp_path: Path):
    scores = tmp_path / "genome-scores.csv"
    scores.write_text(GENOME_SCORES)
    names = tmp_path / "genome-tags.csv"
    names.write_text(GENOME_TAGS)
    out = attach_tag_scores(ml25m, scores, names)
    assert out.items_with_tag("pixar animation", kind="genome") == ["1"]
    assert out.items_with_tag("politics") == ["11"]
    assert out.items_with_tag("paris") == ["4973"]
    # 0.5 is not above the default threshold; unknown movies are ignored.
    assert "007" not in out.tags
    assert "99999" not in set(out.item_tags["item_id"])
    genome = out.item_tags[out.item_tags["kind"] == "genome"]
    assert len(genome) == 3
    assert out.source["genome_tags"] == {"path": str(scores), "threshold": 0.5}
    assert out.items.set_index("item_id").loc["1", "tags"][-1] == "pixar animation"
    # A lower threshold admits more.
    low = attach_tag_scores(ml25m, scores, names, threshold=0.09, kind="genome-low")
    assert low.items_with_tag("007", kind="genome-low") == ["4973"]
    assert low.items_with_tag("paris", kind="genome-low") == ["1", "4973"]


def test_tag_scores_with_tag_names_inline(ml25m: Dataset, tmp_path: Path):
    scores = tmp_path / "scores.tsv"
    scores.write_text("item_id\ttag\tscore\n1\ttoys\t0.8\n11\ttoys\t0.2\n")
    out = attach_tag_scores(ml25m, scores)
    assert out.items_with_tag("toys") == ["1"]


def test_tag_scores_unknown_tag_ids_are_skipped(ml25m: Dataset, tmp_path: Path):
    scores = tmp_path / "genome-scores.csv"
    scores.write_text("movieId,tagId,relevance\n1,2,0.9\n1,77,0.95\n")
    names = tmp_path / "genome-tags.csv"
    names.write_text(GENOME_TAGS)
    out = attach_tag_scores(ml25m, scores, names)
    genome = out.item_tags[out.item_tags["kind"] == "genome"]
    assert genome["tag"].tolist() == ["pixar animation"]
