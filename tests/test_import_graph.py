"""The module graph of the installed `ctrlsim` package: no import cycles, reports never import
runners, and no module over MAX_LINES lines.

The graph is read from the source with `ast` (nothing is imported), over every module the
package installs: `ctrlsim/`, `envs/` (installed as `ctrlsim.envs`) and `agents/` (installed as
`ctrlsim.agents`). Edge rules:

- Every `import` and `from ... import` of a `ctrlsim` module counts, at module level, inside
  functions (a deferred import is still a dependency) and inside `if TYPE_CHECKING:` (a type-only
  import is still a dependency of the design: a circle through one means a type lives in the
  wrong module).
  Relative imports are resolved against the importing module's package.
- `import ctrlsim.x.y` names module `ctrlsim.x.y` if it exists, else the nearest package above
  it that does; `from ctrlsim.x import name` names the submodule `ctrlsim.x.name` when there is
  one, else `ctrlsim.x` itself.
- Importing `ctrlsim.x.y` also runs `ctrlsim/x/__init__.py`, but that implicit edge is not added:
  every submodule would then "depend" on its package, and every eager `__init__` that re-exports
  its submodules would close a cycle with each of them.
- A package's function-level imports of its own submodules are dropped: that is the PEP 562
  pattern (`def __getattr__(name): from .sub import name`), and such an import runs only after
  the package has finished initialising, so a submodule that reads names from its package is
  not caught in a half-built one. Module-level imports of its own submodules stay: they run
  while the package initialises, and a submodule importing it back is a real cycle. (Today
  this drops `ctrlsim -> ctrlsim.experiments.driver`, the lazy `ctrlsim.run`: without it any
  module that read `ctrlsim.__version__` would close a cycle through the whole driver.)
- `importlib.import_module(...)` with a computed name (as `ctrlsim.agents.__getattr__` uses) is
  not an import statement and is not seen.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
# Source folder -> the package name it installs as (pyproject's [tool.setuptools] package-dir).
ROOTS = {"ctrlsim": REPO / "ctrlsim", "ctrlsim.envs": REPO / "envs", "ctrlsim.agents": REPO / "agents"}
MAX_LINES = 450
# The table of runners `ctrlsim <protocol>` dispatches to (cli.py's PROTOCOLS is this table).
RUNNER_TABLE = (REPO / "ctrlsim" / "experiments" / "runner.py", "RUNNER_MODULES")


def runner_modules() -> set[str]:
    """The modules of the registered runners, read from RUNNER_TABLE's dict literal."""
    path, name = RUNNER_TABLE
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return set(ast.literal_eval(value).values())
    raise AssertionError(f"no {name} dict in {path}: where are the runners registered now?")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def package_modules(roots: dict[str, Path] = ROOTS) -> dict[str, Module]:
    """Installed module name -> its source file, for every .py file under `roots`."""
    modules: dict[str, Module] = {}
    for prefix, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join([prefix, *parts])
            # ctrlsim/ holds no envs/ or agents/ folder, so the three roots never claim one name twice.
            assert name not in modules, f"{name} comes from {modules[name].path} and {path}"
            modules[name] = Module(name, path, is_package)
    return modules


class _Imports(ast.NodeVisitor):
    """(import statement, deferred?) for each import, `if TYPE_CHECKING:` blocks included."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
        self._depth = 0  # > 0 inside a function body

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self._depth > 0))


def _existing(name: str, modules: dict[str, Module]) -> str | None:
    """`name` if it is a module of the package, else the nearest enclosing one (None outside ctrlsim)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: Module, modules: dict[str, Module]) -> list[tuple[str, int, bool]]:
    """(imported ctrlsim module, line, deferred) for every import in `module`."""
    collector = _Imports()
    collector.visit(ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path)))
    out: list[tuple[str, int, bool]] = []
    for node, deferred in collector.found:
        if isinstance(node, ast.Import):
            targets = [_existing(alias.name, modules) for alias in node.names]
        else:
            if node.level:
                base_parts = module.package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [_existing(f"{base}.{alias.name}", modules) if f"{base}.{alias.name}" in modules
                       else _existing(base, modules) for alias in node.names]
        out.extend((t, node.lineno, deferred) for t in targets if t is not None)
    return out


def _own_submodule(package: Module, target: str) -> bool:
    return package.is_package and target.startswith(package.name + ".")


def import_graph(roots: dict[str, Path] = ROOTS) -> nx.DiGraph:
    """Edges importer -> imported, each with the lines of the imports that make it."""
    modules = package_modules(roots)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module in modules.values():
        for target, line, deferred in imports_of(module, modules):
            if target == module.name or (deferred and _own_submodule(module, target)):
                continue  # see the module docstring: a PEP 562 __init__ reaching its own submodules
            if graph.has_edge(module.name, target):
                graph.edges[module.name, target]["lines"].append(line)
            else:
                graph.add_edge(module.name, target, lines=[line])
    return graph


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph()


def _describe(graph: nx.DiGraph, cycle: list[str]) -> str:
    hops = zip(cycle, cycle[1:] + cycle[:1])
    return " -> ".join(f"{a} (line {graph.edges[a, b]['lines'][0]})" for a, b in hops) + f" -> {cycle[0]}"


def test_the_graph_reads_what_the_package_imports(graph):
    """Edges known from the source: an eager `__init__`'s import, a deferred one, a relative
    one, a name read from a package."""
    assert graph.has_edge("ctrlsim.backends", "ctrlsim.backends.encoders")          # eager __init__
    assert graph.has_edge("ctrlsim.backends.specs", "ctrlsim.backends.llamacpp.llm")    # inside load_llm
    assert graph.has_edge("ctrlsim.envs.probe_env", "ctrlsim.envs.checks")          # from .checks import
    assert graph.has_edge("ctrlsim.envs.probe_env", "ctrlsim.backends")             # a name of the package
    assert graph.has_edge("ctrlsim.backends.hf", "ctrlsim.lazy")
    assert "ctrlsim.envs" in graph and "ctrlsim.agents.evolution.loop" in graph


def test_the_edge_rules_on_a_package_written_here(tmp_path):
    files = {
        "__init__.py": "def __getattr__(name):\n    from ctrlsim.fake import lazy_target\n    return name\n",
        "a.py": "from . import b\nimport ctrlsim.fake.c.missing\nimport numpy\n",
        "b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ctrlsim.fake import a\n"
                 "else:\n    from .c import thing\n"),
        "c.py": "def later():\n    from ctrlsim.fake.b import thing\n",
        "lazy_target.py": "from ctrlsim.fake import something_public\n",
        "sub/__init__.py": "from .inner import x\n",
        "sub/inner.py": "from .. import a\nfrom ctrlsim.fake.sub import y\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = import_graph({"ctrlsim.fake": tmp_path})
    assert sorted(g.edges) == sorted([
        ("ctrlsim.fake.a", "ctrlsim.fake.b"),             # relative `from . import b`: the submodule
        ("ctrlsim.fake.a", "ctrlsim.fake.c"),             # c.missing does not exist: its package
        ("ctrlsim.fake.b", "ctrlsim.fake.a"),             # a TYPE_CHECKING import counts
        ("ctrlsim.fake.b", "ctrlsim.fake.c"),             # and so does its else branch
        ("ctrlsim.fake.c", "ctrlsim.fake.b"),             # a function-level import counts
        ("ctrlsim.fake.lazy_target", "ctrlsim.fake"),     # a name, not a submodule: the package
        ("ctrlsim.fake.sub", "ctrlsim.fake.sub.inner"),   # an eager __init__ keeps its submodules
        ("ctrlsim.fake.sub.inner", "ctrlsim.fake.a"),     # `from .. import a`
        ("ctrlsim.fake.sub.inner", "ctrlsim.fake.sub"),
    ])  # and ctrlsim.fake's PEP 562 import of lazy_target is dropped
    assert sorted(sorted(c) for c in nx.simple_cycles(g)) == [
        ["ctrlsim.fake.a", "ctrlsim.fake.b"], ["ctrlsim.fake.a", "ctrlsim.fake.b", "ctrlsim.fake.c"],
        ["ctrlsim.fake.b", "ctrlsim.fake.c"], ["ctrlsim.fake.sub", "ctrlsim.fake.sub.inner"]]


def test_no_import_cycles(graph):
    cycles = sorted((list(c) for c in nx.simple_cycles(graph)), key=lambda c: (len(c), c))
    for cycle in cycles:
        print("import cycle:", _describe(graph, cycle))
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(_describe(graph, c) for c in cycles)


def test_reports_never_import_from_runners(graph):
    """A report turns stored records into tables; it must not reach back into the runner
    that wrote them (a report module: a name ending in `_report`, or a module `report`)."""
    runners = runner_modules()
    assert {"ctrlsim.experiments.ctrlbench.runner", "ctrlsim.experiments.probe.runner"} <= runners
    assert runners <= set(graph), sorted(runners - set(graph))
    reports = [m for m in graph if m.endswith("_report") or m.rpartition(".")[2] == "report"]
    assert reports, "no report module found: the rule below would check nothing"
    offenders = sorted(f"{m} imports {t} (line {graph.edges[m, t]['lines'][0]})"
                       for m in reports for t in graph.successors(m) if t in runners)
    for line in offenders:
        print("report imports a runner:", line)
    assert not offenders, "\n".join(offenders)


def test_no_module_is_over_the_line_limit():
    sizes = {m.name: len(m.path.read_text(encoding="utf-8").splitlines()) for m in package_modules().values()}
    over = sorted(((n, name) for name, n in sizes.items() if n > MAX_LINES), reverse=True)
    for n, name in over:
        print(f"{name}: {n} lines")
    assert not over, f"modules over {MAX_LINES} lines: " + ", ".join(f"{name} ({n})" for n, name in over)


PROTOCOL_FILES = ("config", "units", "report", "runner")
RUNNER_MAX_LINES = 45  # a runner module declares; it does not compute


def protocol_packages() -> list[str]:
    """The protocol folders under ctrlsim/experiments/ (each a package holding a runner.py)."""
    root = REPO / "ctrlsim" / "experiments"
    return sorted(p.parent.name for p in root.glob("*/runner.py"))


def test_every_protocol_is_one_folder_with_the_same_four_files():
    protocols = protocol_packages()
    assert set(protocols) >= {"audit", "calibrate", "ctrlbench", "evolve", "probe", "promptshift",
                              "steereval", "train_probe"}, protocols
    root = REPO / "ctrlsim" / "experiments"
    missing = [f"{p}/{f}.py" for p in protocols for f in PROTOCOL_FILES
               if not (root / p / f"{f}.py").is_file()]
    assert not missing, missing
    lines = {p: len((root / p / "runner.py").read_text(encoding="utf-8").splitlines()) for p in protocols}
    long = {p: n for p, n in lines.items() if n > RUNNER_MAX_LINES}
    assert not long, f"runner.py over {RUNNER_MAX_LINES} lines: {long}"
    flat = sorted(f.name for f in root.glob("*.py") if f.stem.split("_")[0] in protocols)
    assert not flat, f"protocol modules left at the framework level: {flat}"


def test_a_protocol_config_imports_none_of_its_siblings(graph):
    offenders = sorted(f"{source} imports {target}" for p in protocol_packages()
                       for source in [f"ctrlsim.experiments.{p}.config"]
                       for target in graph.successors(source)
                       if target.startswith(f"ctrlsim.experiments.{p}."))
    assert not offenders, offenders


def _string_constants(tree: ast.AST) -> list[str]:
    """Every string constant of a module except docstrings (examples in prose may name a model)."""
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            docstrings.add(id(body[0].value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_the_default_llms_name_has_one_home():
    """The runners' default model is named once, in backends/bundled.py; every config reads it from there."""
    from ctrlsim.backends.bundled import BUNDLED_LLMS, DEFAULT_PROBE_LLM

    assert DEFAULT_PROBE_LLM in BUNDLED_LLMS
    home = REPO / "ctrlsim" / "backends" / "bundled.py"
    def names_it(path: Path) -> bool:
        return DEFAULT_PROBE_LLM in _string_constants(ast.parse(path.read_text(encoding="utf-8")))

    assert names_it(home)
    elsewhere = sorted(str(m.path.relative_to(REPO)) for m in package_modules().values()
                       if m.path != home and names_it(m.path))
    assert not elsewhere, f"{DEFAULT_PROBE_LLM!r} is written outside {home.name}: {elsewhere}"


def test_protocol_modules_leave_resources_to_the_framework():
    """A protocol folder loads no dataset or model itself, chooses no cache path, draws no progress
    bar and reads no environment: the framework (`ctrlsim.experiments.context`) does these once."""
    root = REPO / "ctrlsim" / "experiments"
    found = sorted(f"{path.relative_to(REPO)}: {word}" for p in protocol_packages()
                   for path in (root / p).glob("*.py")
                   for word in ("load_dataset", "cache_root", "tqdm", "os.environ")
                   if word in path.read_text(encoding="utf-8"))
    assert not found, found


def test_no_protocol_imports_another_protocols_package(graph):
    """Calibrate and the audit reach other protocols through `Runner.observation`, the driver and
    `RunResult.summary` (the calibration's numbers as data), never by importing them."""
    packages = {f"ctrlsim.experiments.{p}" for p in protocol_packages()}

    def package_of(module: str) -> str | None:
        return next((p for p in packages if module == p or module.startswith(p + ".")), None)

    crossing = sorted(f"{a} imports {b}" for a, b in graph.edges
                      if package_of(a) and package_of(b) and package_of(a) != package_of(b))
    assert not crossing, crossing


def test_the_environment_holds_resources_and_secrets_only():
    """No `CTRLSIM_*` variable may change a recorded number: the library reads the cache folder, the
    thread count and two tokens, and forwards `CTRLSIM_*` to remote workers as a whole; every
    setting that changes a reply is in a config or model spec (`backends/llamacpp/profile.py`)."""
    import re

    allowed = {"CTRLSIM_CACHE", "CTRLSIM_THREADS", "CTRLSIM_RECOMMENDER_TOKEN", "CTRLSIM_SERVE_TOKEN"}
    found: dict[str, set[str]] = {}
    for root in ROOTS.values():
        for path in root.rglob("*.py"):
            for name in re.findall(r"CTRLSIM_[A-Z0-9_]*", path.read_text(encoding="utf-8")):
                if name != "CTRLSIM_":  # the prefix itself, as the Ray executor forwards it
                    found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    assert set(found) <= allowed, {k: sorted(v) for k, v in found.items() if k not in allowed}
    assert {"CTRLSIM_CACHE", "CTRLSIM_THREADS"} <= set(found)  # the check reads the real tree


# What only the framework's unit context (`ctrlsim.experiments.context`) calls: the worker cache, the
# loaders of datasets, boxes and models, and response-cache files. Names, not words: help texts may
# name `make_recommender` or a `load_llm` spec.
ACQUISITION = frozenset({"worker_cache", "run_dataset", "cached_dataset", "cached_llm", "provide_llm",
                         "shared_cache_file", "load_llm", "load_encoder", "resolve_llm", "resolve_encoder",
                         "make_recommender", "ResponseCache", "cache_dir"})


def acquisition_names(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, line) of every use or import of an ACQUISITION name in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in ACQUISITION:
            found.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr in ACQUISITION:
            found.append((node.attr, node.lineno))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend((a.name.rpartition(".")[2], node.lineno) for a in node.names
                         if a.name.rpartition(".")[2] in ACQUISITION)
    return found


def test_acquisition_names_are_found_as_calls_imports_and_attributes_not_as_prose():
    tree = ast.parse('"""uses make_recommender"""\nfrom ctrlsim.experiments.units import worker_cache\n'
                     'import ctrlsim.backends.load_llm\nx = units.cached_llm("a")\nhelp = "a load_llm spec"\n'
                     'y = make_recommender\n')
    assert sorted(acquisition_names(tree)) == [("cached_llm", 4), ("load_llm", 3), ("make_recommender", 6),
                                               ("worker_cache", 2)]


def test_protocol_modules_acquire_everything_through_the_unit_context():
    """No protocol module reaches the worker cache, a loader or a cache file itself: its units and
    hooks go through `UnitContext` (one acquisition path, one key format, one cache policy)."""
    root = REPO / "ctrlsim" / "experiments"
    found = sorted(f"{path.relative_to(REPO)}:{line}: {name}" for p in protocol_packages()
                   for path in (root / p).glob("*.py")
                   for name, line in acquisition_names(ast.parse(path.read_text(encoding="utf-8"))))
    assert not found, found
