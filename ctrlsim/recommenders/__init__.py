"""Black-box recommenders behind one batched protocol."""
from ctrlsim.recommenders.base import Recommender, Slate, UserState

__all__ = ["Recommender", "Slate", "UserState"]
