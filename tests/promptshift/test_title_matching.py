"""Matching generated titles to the catalogue: exact, article/year variants, fuzzy, unmatched."""
import pandas as pd
import pytest

from ctrlsim.data.matching import (
    TitleMatcher,
    display_title,
    match_counts,
    natural_order,
    normalize_title,
    split_year,
)
from ctrlsim.errors import ConfigError


@pytest.fixture(scope="module")
def catalogue():
    return pd.DataFrame({
        "item_id": ["1", "2", "3", "4", "5", "6", "7", "8", "9"],
        "title": ["Shining, The", "Postino, Il", "Cape Fear", "Cape Fear", "Seven (Se7en)",
                  "Big Blue, The (Grand bleu, Le)", "Misérables, Les", "Schindler's List",
                  "Little Princess, A"],
        "year": [1980, 1994, 1962, 1991, 1995, 1988, 1995, 1993, 1995],
        "popularity": [200, 50, 10, 90, 230, 20, 15, 300, 40],
    })


@pytest.fixture(scope="module")
def matcher(catalogue):
    return TitleMatcher(catalogue, threshold=90)


def test_normalisation_helpers():
    assert split_year("Shining, The (1980)") == ("Shining, The", 1980)
    assert split_year("Shining") == ("Shining", None)
    assert natural_order("Shining, The") == "The Shining"
    assert natural_order("Big Blue, The (Grand bleu, Le)") == "The Big Blue (Le Grand bleu)"
    assert natural_order("Uomo delle stelle, L'") == "L'Uomo delle stelle"
    assert normalize_title("Shining, The (1980)") == normalize_title("the SHINING") == "the shining"
    assert normalize_title("Misérables, Les") == "les miserables"
    assert display_title("Shining, The", 1980) == "The Shining (1980)"


@pytest.mark.parametrize("title, item", [
    ("The Shining (1980)", "1"), ("Shining, The", "1"), ("the shining", "1"), ("Il Postino", "2"),
    ("Se7en (1995)", "5"), ("Seven", "5"), ("The Big Blue", "6"), ("Les Miserables (1995)", "7"),
    ("Schindlers List", "8"), ("\"The Shining\"", "1"),
])
def test_exact_and_variant_matches(matcher, title, item):
    m = matcher.match(title)
    assert m.item_id == item
    if item is not None:
        assert m.kind == "exact"


def test_year_picks_between_same_titles(matcher):
    assert matcher.match("Cape Fear (1962)").item_id == "3"
    assert matcher.match("Cape Fear (1991)").item_id == "4"
    # no year: the more popular one; a wrong year still matches the title, flagged as such
    assert matcher.match("Cape Fear").item_id == "4"
    m = matcher.match("The Shining (1997)")
    assert (m.item_id, m.kind, m.year) == ("1", "exact_title", 1997)


def test_article_free_fallback(matcher):
    m = matcher.match("Big Blue")
    assert (m.item_id, m.kind) == ("6", "no_article")


def test_fuzzy_match_threshold_and_year_guard(catalogue):
    strict = TitleMatcher(catalogue, threshold=90)
    m = strict.match("Schindler's Lists (1993)")
    assert (m.item_id, m.kind) == ("8", "fuzzy") and m.score >= 90
    # a fuzzy candidate whose year contradicts the generated one is rejected
    assert strict.match("The Little Prince (1959)").item_id is None
    assert TitleMatcher(catalogue, threshold=99).match("Schindler's Lists").item_id is None
    assert TitleMatcher(catalogue, fuzzy=False).match("Schindler's Lists").item_id is None


def test_unmatched_kept_and_counted(matcher):
    titles = ["The Shining", "Inception (2010)", "Seven", "Schindlers Lists (1993)", ""]
    matches = matcher.match_many(titles)
    assert [m.title for m in matches] == titles
    assert [m.item_id for m in matches] == ["1", None, "5", "8", None]
    counts = match_counts(matches)
    assert counts["matched"] == 3 and counts["unmatched"] == 2 and counts["total"] == 5
    assert counts["exact"] == 2 and counts["fuzzy"] == 1


def test_bad_threshold(catalogue):
    with pytest.raises(ConfigError):
        TitleMatcher(catalogue, threshold=120)


def test_real_catalogue(ml100k):
    m = TitleMatcher(ml100k.items)
    for title, expected in [("The Usual Suspects (1995)", "Usual Suspects, The"),
                            ("Star Wars (1977)", "Star Wars"), ("Twelve Monkeys", "Twelve Monkeys"),
                            ("The Godfather Part II (1974)", "Godfather: Part II, The")]:
        hit = m.match(title)
        assert hit.item_id is not None and ml100k.item(hit.item_id)["title"] == expected
    assert m.match("The Dark Knight (2008)").item_id is None
