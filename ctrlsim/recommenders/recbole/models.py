"""Which RecBole models ctrlsim can use, found by name."""
from __future__ import annotations

from pathlib import Path

from ctrlsim.backends.bundled import package_dir
from ctrlsim.data.registry import recbole_missing
from ctrlsim.errors import ModelError
from ctrlsim.recommenders.recbole.sandbox import PURPOSE, import_recbole, numpy_aliases, preserved_rngs

# Sequential models that need what ctrlsim does not give RecBole.
UNSUPPORTED = {
    "DIN": "it is a click-through-rate model that needs item features and labels",
    "DIEN": "it is a click-through-rate model that needs item features and labels",
    "GRU4RecF": "it needs item feature fields",
    "SASRecF": "it needs item feature fields",
    "FDSA": "it needs item feature fields",
    "S3Rec": "it needs item attributes and a separate pre-training stage",
    "KSR": "it needs knowledge-graph embeddings",
    "GRU4RecKG": "it needs knowledge-graph embeddings",
}


def _model_properties() -> Path:
    root = package_dir("recbole")
    if root is None:
        raise recbole_missing(PURPOSE)
    return root / "properties" / "model"


def model_defaults(model: str) -> dict:
    """The model's RecBole defaults (its properties/model/<Model>.yaml), read without importing RecBole."""
    path = _model_properties() / f"{model}.yaml"
    if not path.is_file():
        return {}
    import yaml  # a RecBole dependency

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


def _check_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ModelError(f"a RecBole sequential model name is required, got {name!r}")
    return name.strip()


def model_name_without_import(name: str) -> str | None:
    """RecBole's spelling of a model name (e.g. "sasrec" -> "SASRec") from its property
    files, without importing RecBole; None when no model of that name has one.

    It does not tell whether the model is sequential: `resolve_model` does.
    """
    wanted = _check_name(name).lower()
    found = [p.stem for p in _model_properties().glob("*.yaml") if p.stem.lower() == wanted]
    return found[0] if len(found) == 1 else None


def resolve_model(name: str) -> type:
    """The RecBole sequential model class called `name` (case-insensitive).

    Raises `ModelError` for unknown names, non-sequential RecBole models and the
    sequential models ctrlsim cannot feed (feature- or knowledge-graph-based ones).
    """
    name = _check_name(name)
    rb = import_recbole()
    classes = {
        cls_name: obj for cls_name, obj in vars(rb.seq_models).items()
        if isinstance(obj, type) and issubclass(obj, rb.SeqBase) and obj is not rb.SeqBase
    }
    found = [obj for cls_name, obj in classes.items() if cls_name.lower() == name.lower()]
    if not found:
        kind = None
        try:
            with numpy_aliases(), preserved_rngs():  # may import other RecBole model packages
                other = rb.get_model(name)
            kind = getattr(getattr(other, "type", None), "name", "non-sequential")
        except (ValueError, AttributeError, ImportError):
            pass
        supported = sorted(n for n in classes if n not in UNSUPPORTED)
        if kind is not None:
            raise ModelError(f"RecBole model {name!r} is a {kind.lower()} model, not a sequential one; "
                             f"sequential models: {', '.join(supported)}")
        raise ModelError(f"unknown RecBole sequential model {name!r}; available: {', '.join(supported)}")
    cls = found[0]
    if cls.__name__ in UNSUPPORTED:
        raise ModelError(f"RecBole model {cls.__name__} is not supported: {UNSUPPORTED[cls.__name__]}")
    return cls
