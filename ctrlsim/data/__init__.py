"""Datasets: items, interactions, users; loaders for real formats; splits and slices."""
from ctrlsim.data.dataset import Dataset, item_text
from ctrlsim.data.formats import (
    load_amazon,
    load_atomic,
    load_lastfm_1k,
    load_movielens_csv,
    load_movielens_dat,
)
from ctrlsim.data.registry import BUILTIN, FORMATS, load_dataset
from ctrlsim.data.side_tables import attach_descriptions, attach_tag_scores, attach_tag_votes
from ctrlsim.data.splits import (
    AGE_GROUPS,
    ChronologicalSplit,
    age_group,
    chronological_split,
    identity_slices,
    slice_members,
)

__all__ = [
    "AGE_GROUPS", "BUILTIN", "FORMATS", "ChronologicalSplit", "Dataset", "age_group",
    "attach_descriptions", "attach_tag_scores", "attach_tag_votes", "chronological_split",
    "identity_slices", "item_text", "load_amazon", "load_atomic", "load_dataset", "load_lastfm_1k",
    "load_movielens_csv", "load_movielens_dat", "slice_members",
]
