"""A `Dataset`'s interactions as RecBole atomic files, and RecBole's item tokens back to item ids."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ctrlsim.data import Dataset
from ctrlsim.errors import DataError, ModelError

# Name of the RecBole dataset written to the temporary folder. Not "ml-100k": RecBole
# forces data_path to its bundled copy (and loads ml-100k.yaml) for that name.
RECBOLE_DATASET = "ctrlsim_data"


def write_atomic_files(dataset: Dataset, folder: Path, name: str = RECBOLE_DATASET) -> Path:
    """Write the interactions as RecBole atomic files `<folder>/<name>/<name>.inter`.

    Items are written as tokens "i<catalogue index>" and users as "u<n>", so any
    id string survives RecBole's CSV reader (which would turn "NA" into NaN or
    strip quotes); `token_to_item_id` maps item tokens back.
    """
    inter = dataset.interactions
    if inter.empty:
        raise DataError(f"dataset {dataset.name!r} has no interactions to train a sequential model on")
    item_idx = dataset.indices(inter["item_id"])
    user_codes, _ = pd.factorize(inter["user_id"])
    table = pd.DataFrame({
        "user_id": np.char.add("u", user_codes.astype(str)),
        "item_id": np.char.add("i", item_idx.astype(str)),
        "rating": inter["rating"].astype(float).to_numpy(),
        "timestamp": inter["timestamp"].astype("int64").to_numpy(),
    })
    target = Path(folder) / name
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.inter"
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write("user_id:token\titem_id:token\trating:float\ttimestamp:float\n")
        table.to_csv(fh, sep="\t", header=False, index=False, lineterminator="\n")
    return path


def token_to_item_id(dataset: Dataset, token: str) -> str:
    """External item id of an atomic-file item token written by `write_atomic_files`."""
    if not (isinstance(token, str) and token.startswith("i") and token[1:].isdigit()):
        raise ModelError(f"unexpected RecBole item token {token!r}")
    return str(dataset.item_ids[int(token[1:])])
