"""The layers of the ``hmdspt`` package and its packaging (issue 16, points 1 and 2).

Every module's imports are read from its source (AST), none is imported: every ``import``
and ``from ... import`` counts, inside functions and ``TYPE_CHECKING`` blocks too. Imports
point down:

- core (``hmdspt.core``): the standard library, numpy and the core itself, nothing else
  (no Dask, no scikit-learn, no pandas), so that it runs and is tested without a cluster;
- parallel (``hmdspt.parallel``): the core and itself, never the faces nor the app;
- faces (``hmdspt`` itself, ``__main__``, ``estimator``, ``cli``, ``compare`` and the
  simulator ``simulate``): anything below, not the app -- except the CLI's ``monitor``
  sub-command, which imports ``hmdspt.app.cli`` lazily inside ``cmd_monitor``. The
  simulator models the parallel layer without Dask: it uses the core only;
- app (``hmdspt.app``): the core (the run log) and itself, never the parallel layer nor the
  faces: the monitor reads run logs and nothing else.

No module imports, through others, itself (no cycles). The packaging tests run in a
subprocess outside the repository, so that only the installed package can be imported.
Nothing here starts a cluster.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy(4)  # fresh interpreters importing each layer

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

FACES = {
    "hmdspt",
    "hmdspt.__main__",
    "hmdspt.cli",
    "hmdspt.compare",
    "hmdspt.estimator",
    "hmdspt.simulate",
}
#: What the core layer holds at least (a test over no modules would pass).
CORE_MODULES = {"nn", "merge", "partition", "runlog", "checkpoint", "speed", "shard"}
PARALLEL_MODULES = {
    "cluster",
    "pools",
    "client",
    "readers",
    "blocks",
    "shards",
    "sources",
    "rebalance",
    "worker",
    "lifecycle",
    "scoring",
    "trainer",
}
#: The one import of the app by a face: ``hmdspt monitor``, inside the sub-command.
CLI_MONITOR = ("hmdspt.cli", "cmd_monitor", "hmdspt.app.cli")


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is and in which function."""

    module: str  # the importing module
    target: str  # a module of hmdspt when it names one, else the imported dotted name
    line: int
    function: str | None  # innermost enclosing function, None at module level

    def __str__(self) -> str:
        where = f" (in {self.function})" if self.function else ""
        return f"{self.module}:{self.line} imports {self.target}{where}"


def _package_dirs() -> dict[str, Path]:
    """Source folder of ``hmdspt`` and of ``hmdspt.app``, as the installation maps them."""
    dirs = {}
    for name in ("hmdspt", "hmdspt.app"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
        dirs[name] = Path(list(spec.submodule_search_locations)[0])
    return dirs


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    out: dict[str, Path] = {}
    for package, folder in _package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.setdefault(".".join((package, *parts)), path)
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def resolve(base: str, name: str) -> str:
        full = f"{base}.{name}" if base else name
        return full if full in MODULES else base

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(module, alias.name, child.lineno, function))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parent, *([base] if base else [])])
                for alias in child.names:
                    found.append(Import(module, resolve(base, alias.name), child.lineno, function))
            visit(child, function)

    visit(tree, None)
    return found


IMPORTS = {module: _imports(module, path) for module, path in MODULES.items()}


def _layer(module: str) -> str:
    if module.startswith("hmdspt.core.") or module == "hmdspt.core":
        return "core"
    if module.startswith("hmdspt.parallel.") or module == "hmdspt.parallel":
        return "parallel"
    if module.startswith("hmdspt.app.") or module == "hmdspt.app":
        return "app"
    return "faces"


def _of_layer(layer: str) -> list[Import]:
    return [i for m, found in IMPORTS.items() if _layer(m) == layer for i in found]


def _is_within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def test_the_package_holds_the_expected_layers():
    # A misplaced module would escape its layer's rule: every module is in a known place.
    core = {m.rpartition(".")[2] for m in MODULES if _layer(m) == "core"} - {"core"}
    parallel = {m.rpartition(".")[2] for m in MODULES if _layer(m) == "parallel"} - {"parallel"}
    faces = {m for m in MODULES if _layer(m) == "faces"}
    assert core >= CORE_MODULES, CORE_MODULES - core
    assert parallel >= PARALLEL_MODULES, PARALLEL_MODULES - parallel
    assert faces == FACES, "a new module at the top of hmdspt: a face, or does it go down?"
    assert {"hmdspt.app.monitor", "hmdspt.app.rundata", "hmdspt.app.cli"} <= set(MODULES)


def test_core_imports_only_the_standard_library_numpy_and_the_core():
    allowed = set(sys.stdlib_module_names) | {"numpy", "__future__"}
    bad = [
        str(i)
        for i in _of_layer("core")
        if not _is_within(i.target, "hmdspt.core") and i.target.split(".")[0] not in allowed
    ]
    assert not bad, bad


def test_parallel_imports_neither_the_faces_nor_the_app():
    bad = [
        str(i)
        for i in _of_layer("parallel")
        if _is_within(i.target, "hmdspt")
        and not (_is_within(i.target, "hmdspt.core") or _is_within(i.target, "hmdspt.parallel"))
    ]
    assert not bad, bad


def test_faces_do_not_import_the_app_but_the_cli_monitor_lazily():
    bad = [
        str(i)
        for i in _of_layer("faces")
        if _is_within(i.target, "hmdspt.app") and (i.module, i.function, i.target) != CLI_MONITOR
    ]
    assert not bad, bad
    # The one allowed import exists, and only inside the sub-command (a lazy import).
    monitor = [i for i in IMPORTS["hmdspt.cli"] if _is_within(i.target, "hmdspt.app")]
    assert [(i.module, i.function, i.target) for i in monitor] == [CLI_MONITOR]


def test_the_simulator_uses_the_core_only():
    ours = [i for i in IMPORTS["hmdspt.simulate"] if _is_within(i.target, "hmdspt")]
    assert ours, "the simulator drives the real scorer and policy of the core"
    bad = [str(i) for i in ours if not _is_within(i.target, "hmdspt.core")]
    assert not bad, bad
    assert not [str(i) for i in IMPORTS["hmdspt.simulate"] if i.target.split(".")[0] == "dask"]


def test_the_app_imports_only_the_core_and_itself():
    ours = [i for i in _of_layer("app") if _is_within(i.target, "hmdspt")]
    assert any(_is_within(i.target, "hmdspt.core.runlog") for i in ours)
    bad = [
        str(i)
        for i in ours
        if not (_is_within(i.target, "hmdspt.core") or _is_within(i.target, "hmdspt.app"))
    ]
    assert not bad, bad


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_between_modules():
    graph = {
        m: {i.target for i in found if i.target in MODULES and i.target != m}
        for m, found in IMPORTS.items()
    }
    assert sum(map(len, graph.values())) > 30, "the graph lost its edges"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


# ----------------------------------------------------------------------------- packaging
def test_pyproject_packages_every_folder_of_the_two_trees():
    # package-dir maps the folders; a subpackage left out of ``packages`` would be missing
    # from a wheel while an editable install still finds it.
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"hmdspt": "pipeline", "hmdspt.app": "app"}
    folders = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            folders.add(".".join((package, *parts)))
    assert set(setuptools["packages"]) == folders
    assert {"hmdspt", "hmdspt.core", "hmdspt.parallel", "hmdspt.app"} <= folders


def _run_outside(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python -c code`` in an empty folder, without PYTHONPATH: only what is installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


_DISTRIBUTION = """
import importlib.metadata as md, json
import hmdspt
from hmdspt import BPNNClassifier, BPNNRegressor, local_cluster, score_workers
dist = md.distribution("hmdspt")
print(json.dumps({
    "version": hmdspt.__version__,
    "metadata_version": dist.version,
    "top_level": (dist.read_text("top_level.txt") or "").split(),
    "scripts": [ep.value for ep in dist.entry_points if ep.group == "console_scripts"],
    "files": [str(f) for f in dist.files or ()],
    "faces": [f.__module__ for f in (BPNNClassifier, BPNNRegressor, local_cluster, score_workers)],
}))
"""


def test_the_installed_distribution_is_the_one_package_hmdspt(tmp_path):
    result = _run_outside(_DISTRIBUTION, tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["version"] == info["metadata_version"] == PYPROJECT["project"]["version"]
    assert info["top_level"] == ["hmdspt"]
    assert info["scripts"] == ["hmdspt.cli:main"] == [PYPROJECT["project"]["scripts"]["hmdspt"]]
    assert info["faces"] == [
        "hmdspt.estimator",
        "hmdspt.estimator",
        "hmdspt.parallel.cluster",
        "hmdspt.parallel.scoring",
    ]
    # A regular install lists its modules (an editable one lists its path finder instead).
    modules = [f for f in info["files"] if f.endswith(".py") and "__editable__" not in f]
    assert all(f.startswith("hmdspt/") for f in modules), modules


def test_a_fresh_install_has_no_top_level_pipeline_or_app(tmp_path):
    # Holds once the old two-package install (pipeline, app) is gone: a fresh ``pip
    # install -e .`` replaces it.
    code = (
        "import importlib.util as u, json, hmdspt.app; "
        "print(json.dumps([u.find_spec('pipeline') is None, u.find_spec('app') is None]))"
    )
    result = _run_outside(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [True, True]


def test_importing_hmdspt_and_its_core_loads_neither_dask_nor_scikit_learn(tmp_path):
    code = (
        "import importlib, pkgutil, sys, hmdspt, hmdspt.core; "
        "[importlib.import_module(m.name) for m in "
        "pkgutil.walk_packages(hmdspt.core.__path__, 'hmdspt.core.')]; "
        "import hmdspt.app.rundata; "
        "bad = sorted({m.split('.')[0] for m in sys.modules} "
        "& {'dask', 'distributed', 'sklearn', 'pandas', 'panel'}); "
        "print(len([m for m in sys.modules if m.startswith('hmdspt.core.')]), bad)"
    )
    result = _run_outside(code, tmp_path)
    assert result.returncode == 0, result.stderr
    n_core, bad = result.stdout.split(" ", 1)
    assert int(n_core) >= len(CORE_MODULES) and bad.strip() == "[]", result.stdout


def test_building_the_command_line_loads_neither_dask_nor_pandas(tmp_path):
    # `hmdspt --help`, `--version` and a usage error build the parser only: with Dask,
    # dask-jobqueue and pandas imported for it `hmdspt --version` took 1.8-2.2 s, 0.4-0.55 s
    # without (2026-12-02, this 2-core machine).
    code = (
        "import sys; from hmdspt.cli import build_parser; build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'dask', 'distributed', 'dask_jobqueue', 'sklearn', 'pandas', 'panel'}))"
    )
    result = _run_outside(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.parametrize(
    "command", [["-m", "hmdspt", "--version"], ["-m", "hmdspt.cli", "--version"]]
)
def test_python_m_hmdspt_prints_the_version(tmp_path, command):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"hmdspt {PYPROJECT['project']['version']}"


def test_what_a_rebalance_runs_on_the_workers_lives_in_the_core():
    """A worker imports the module of each function it is sent. The core's modules are numpy
    only, where the parallel layer's staging module pulls in pandas and pyarrow: seconds on a
    throttled worker, which a fresh cluster's first re-balance (or recovery) would pay."""
    from hmdspt.parallel import rebalance

    sent = (rebalance._concat_shards, rebalance._shard_head, rebalance._shard_tail)
    for func in (*sent, rebalance._held_ids):
        assert func.__module__ == "hmdspt.core.shard", func
