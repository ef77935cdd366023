"""Black-box recommenders behind one batched protocol: `make_recommender(name, dataset)`."""
from ctrlsim.recommenders.base import Recommender, Slate, UserState
from ctrlsim.recommenders.registry import RECOMMENDERS, make_recommender, register_recommender

__all__ = ["RECOMMENDERS", "Recommender", "Slate", "UserState", "make_recommender", "register_recommender"]
