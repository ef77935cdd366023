"""Optional side tables: item descriptions and item tags with votes or scores.

SteerEval joins MovieLens to TMDb overviews through `links.csv`, keeps genome
tags with relevance > 0.5 and DoesTheDogDie trigger tags whose yes-votes exceed
75% of votes. These functions return a new `Dataset`; the input is unchanged.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ctrlsim.data._io import read_delimited, require_columns, to_numeric
from ctrlsim.data.dataset import Dataset
from ctrlsim.errors import ConfigError, DataFileError


def _sep(path: Path) -> str:
    return "\t" if path.suffix in {".tsv", ".tab"} else ","


def _pick(df: pd.DataFrame, candidates: tuple[str, ...], path: Path, what: str) -> str:
    for c in candidates:
        if c in df.columns:
            return c
    raise DataFileError(path, f"no {what} column (looked for {list(candidates)}); found {list(df.columns)}")


def _map_ids(df: pd.DataFrame, path: Path, links: str | Path | None) -> pd.Series:
    """Dataset item ids for the rows of a side table, through a links file if given."""
    if links is None:
        return df[_pick(df, ("item_id", "movieId", "asin"), path, "item id")].astype(str)
    links = Path(links)
    link_df = read_delimited(links, sep=_sep(links))
    require_columns(link_df, ["movieId", "tmdbId"], links)
    # Movies without a TMDb id must not match table rows without one (both would read "nan").
    link_df = link_df.dropna(subset=["movieId", "tmdbId"])
    tmdb_to_item = dict(zip(link_df["tmdbId"].astype(str).str.replace(r"\.0$", "", regex=True),
                            link_df["movieId"].astype(str)))
    key_column = _pick(df, ("tmdbId", "tmdb_id", "id"), path, "TMDb id")
    key = df[key_column].astype(str).str.replace(r"\.0$", "", regex=True)
    return key.map(tmdb_to_item)


def attach_descriptions(dataset: Dataset, path: str | Path, *, links: str | Path | None = None,
                        text_column: str | None = None) -> Dataset:
    """Add item descriptions (e.g. TMDb overviews) to `items.description` and item text.

    `path` is a csv/tsv with an item id column (item_id/movieId/asin) and a
    text column (description/overview/plot), or, with `links` (MovieLens
    links.csv), a TMDb table keyed by tmdbId/id.
    """
    path = Path(path)
    df = read_delimited(path, sep=_sep(path))
    text_col = text_column or _pick(df, ("description", "overview", "plot"), path, "description")
    require_columns(df, [text_col], path)
    ids = _map_ids(df, path, links)
    desc = pd.Series(df[text_col].fillna("").astype(str).to_numpy(), index=ids.to_numpy())
    desc = desc[desc.index.notna() & (desc != "")]
    desc = desc[~desc.index.duplicated()]
    out = dataset.with_descriptions(desc)
    out.source["descriptions"] = str(path)
    return out


def attach_tag_votes(dataset: Dataset, path: str | Path, *, threshold: float = 0.75,
                     links: str | Path | None = None, kind: str = "trigger") -> Dataset:
    """Add tags whose yes-vote share exceeds `threshold` (DoesTheDogDie style).

    The table has an item id column (or tmdbId with `links`), a tag column
    (tag/topic) and yes/no vote counts (yes, no or yes_votes, no_votes).
    """
    if not 0.0 <= threshold < 1.0:
        raise ConfigError(f"vote threshold must be in [0, 1), got {threshold}")
    path = Path(path)
    df = read_delimited(path, sep=_sep(path))
    tag_col = _pick(df, ("tag", "topic", "name"), path, "tag")
    # Vote counts: whole numbers, not negative.
    yes_col = _pick(df, ("yes", "yes_votes", "yesSum"), path, "yes-vote")
    no_col = _pick(df, ("no", "no_votes", "noSum"), path, "no-vote")
    yes = to_numeric(df, yes_col, path, low=0, integer=True)
    no = to_numeric(df, no_col, path, low=0, integer=True)
    total = yes + no
    share = yes.where(total > 0, 0) / total.where(total > 0, 1)
    ids = _map_ids(df, path, links)
    rows = pd.DataFrame({"item_id": ids, "tag": df[tag_col]})[(share > threshold) & ids.notna()]
    out = dataset.add_item_tags(rows, kind=kind)
    out.source[f"{kind}_tags"] = {"path": str(path), "threshold": threshold}
    return out


def attach_tag_scores(dataset: Dataset, scores_path: str | Path, tags_path: str | Path | None = None, *,
                      threshold: float = 0.5, kind: str = "genome") -> Dataset:
    """Add tags whose relevance score exceeds `threshold` (MovieLens tag genome).

    `scores_path`: movieId/item_id, tagId or tag, relevance. `tags_path`
    (genome-tags.csv: tagId, tag) names the tag ids.
    """
    scores_path = Path(scores_path)
    df = read_delimited(scores_path, sep=_sep(scores_path))
    # The tag genome's relevance is a score in [0, 1].
    rel = to_numeric(df, _pick(df, ("relevance", "score"), scores_path, "relevance"), scores_path,
                     low=0.0, high=1.0)
    ids = _map_ids(df, scores_path, None)
    if "tag" in df.columns:
        tags = df["tag"]
    else:
        if tags_path is None:
            raise DataFileError(scores_path, "has tag ids but no tag names; pass tags_path (genome-tags.csv)")
        tags_path = Path(tags_path)
        names = read_delimited(tags_path, sep=_sep(tags_path))
        require_columns(names, ["tagId", "tag"], tags_path)
        require_columns(df, ["tagId"], scores_path)
        tags = df["tagId"].map(dict(zip(names["tagId"], names["tag"])))
    rows = pd.DataFrame({"item_id": ids, "tag": tags})[(rel > threshold) & tags.notna()]
    out = dataset.add_item_tags(rows, kind=kind)
    out.source[f"{kind}_tags"] = {"path": str(scores_path), "threshold": threshold}
    return out
