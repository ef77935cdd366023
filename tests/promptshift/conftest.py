"""A six-movie, two-user dataset small enough to compute every PromptShift number by hand."""
import pandas as pd
import pytest

from ctrlsim.data import Dataset
from ctrlsim.recommenders.promptshift.data import PromptShiftData
from ctrlsim.recommenders.promptshift.generation import GeneratedList

TITLES = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot"]


@pytest.fixture(scope="module")
def hand_data():
    """Movies i1..i6 = Alpha (1990) .. Foxtrot (1995); every rating is 5 (a positive).

    u1 (F, 25) watches i1, i2, i3, i4, then i5; u2 (M, 30) watches i1, i4, i5, i6, then i2.
    Five interactions split 72/8/20 -> fit = the first four, test = the fifth; H_u = the last two fit items.
    Slice table (fit positives; lambda = min(1, 1/30) = 1/30 for both gender slices):
      phi~(., F) = 1 1 1 1 0 0,  phi~(., M) = 1 0 0 1 1 1,  phi~(., *) = 1 .5 .5 1 .5 .5
      Delta phi(i, F) = (phi~(i, F) - phi~(i, *)) / 30 = 0, 1/60, 1/60, 0, -1/60, -1/60
    """
    items = pd.DataFrame({"item_id": [f"i{n}" for n in range(1, 7)], "title": TITLES,
                          "year": list(range(1990, 1996))})
    rows = ([("u1", i) for i in ("i1", "i2", "i3", "i4", "i5")]
            + [("u2", i) for i in ("i1", "i4", "i5", "i6", "i2")])
    inter = pd.DataFrame([(u, i, 5.0, t) for t, (u, i) in enumerate(rows)],
                         columns=["user_id", "item_id", "rating", "timestamp"])
    users = pd.DataFrame({"user_id": ["u1", "u2"], "gender": ["F", "M"], "age": [25, 30],
                          "occupation": ["x", "y"]})
    ds = Dataset.build("hand", items, inter, users)
    return PromptShiftData.build(ds, scenarios=("gender",), history_len=2, min_fit_positives=2)


# The five lists of u1 in the gender scenario (slice gender_F).
U1_LISTS = {
    "history": ["Echo (1994)", "Foxtrot (1995)", "Bravo (1991)"],                          # i5 i6 i2
    "cue:gender_F": ["Bravo (1991)", "Echo (1994)", "Unknown Film (2001)", "Foxtrot (1995)"],  # i2 i5 ? i6
    "p1": ["Echo (1994)", "Foxtrot (1995)", "Bravo (1991)"],                                # = L^0
    "p2": ["Alpha (1990)", "Delta (1993)", "Charlie (1992)"],                               # disjoint
    "p3": ["Foxtrot (1995)", "Echo (1994)", "Bravo (1991)"],                                # i6 i5 i2
}


@pytest.fixture(scope="module")
def u1_lists():
    """u1's five generated lists (each costing 10 prompt and 5 completion tokens)."""
    return [GeneratedList(c, list(t), "\n".join(t), 10, 5) for c, t in U1_LISTS.items()]
