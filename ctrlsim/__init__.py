"""ctrlsim: measure how controllable recommender systems are.

Importing this package is cheap: heavy dependencies (torch, recbole, LLM
runtimes) load only when a component that needs them is first used.
"""
__version__ = "0.1.0"
