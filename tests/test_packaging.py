"""Packaging: pyproject.toml and environment.yml agree; the README's example runs."""

import re
import subprocess
import sys
import tomllib
from contextlib import nullcontext
from pathlib import Path

import pytest
import yaml

from benchmarks.bench_suite import readme_commands, readme_test_command
from hmdspt.core.runlog import read_events

pytestmark = pytest.mark.heavy(5)

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        names |= {_name(r) for r in extra}
    return names


def _conda_requirements() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            names.add(_name(dep))
    return names - {"python", "pip"}


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    assert _conda_requirements() == _pyproject_requirements()


def test_environment_yml_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    pins = {_name(r): r.strip()[len(_name(r)) :] for r in reqs}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    for dep in env["dependencies"]:
        if isinstance(dep, str) and _name(dep) in pins:
            assert dep.strip()[len(_name(dep)) :] == pins[_name(dep)], dep


def _imported_libraries(*folders: str) -> set[str]:
    """Top-level modules the ``.py`` files under ``folders`` import, less the standard
    library and the repository's own packages."""
    import ast

    modules = set()
    for folder in folders:
        for path in ROOT.joinpath(folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    own = {"hmdspt", "tests", "scripts", "benchmarks", "__future__"}
    return modules - set(sys.stdlib_module_names) - own


@pytest.mark.parametrize(
    "folders, extras", [(("pipeline", "app"), ("jobqueue",)), (("tests",), ("jobqueue", "test"))]
)
def test_every_library_imported_is_a_declared_dependency(folders, extras):
    """Not one that happens to come with another (tqdm came with Panel, psutil with
    distributed): the package's in its dependencies, the tests' in them or the extras."""
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for extra in extras:
        declared |= {_name(r) for r in project["optional-dependencies"][extra]}
    distributions = packages_distributions()
    undeclared = {
        module: distributions.get(module)
        for module in _imported_libraries(*folders)
        if not any(_name(d) in declared for d in distributions.get(module, []))
    }
    assert undeclared == {}


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert len(readme_commands(readme)) == 2, "the README gives exactly two set-up commands"
    assert readme_test_command(readme) in (ROOT / ".ci" / "run").read_text()


def test_readme_python_example_runs(tmp_path, machine_alone):
    readme = (ROOT / "README.md").read_text()
    in_process, on_cluster = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    # Each block is a script of its own, run where a user would, outside the checkout:
    # whatever it writes (runs/) lands there. (One script of both would fit digits again in
    # every worker process, which imports the main module.)
    outputs = []
    for block, alone in ((in_process, nullcontext), (on_cluster, machine_alone)):
        (tmp_path / "example.py").write_text(block)
        with alone():  # the cluster's rows follow the speeds it measures: nothing beside it
            result = subprocess.run(
                [sys.executable, "example.py"],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                timeout=300,
            )
        assert result.returncode == 0, result.stderr
        # Warnings may show (the short fits do not converge), a worker's traceback not: the
        # cluster example once printed one as its cluster closed.
        assert "Traceback" not in result.stderr, result.stderr
        outputs.append(result.stdout)
    assert len(re.findall(r"test accuracy: ([0-9.]+)", outputs[0])) == 1, outputs[0]
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", outputs[0]).group(1))
    assert accuracy > 0.9
    # The cluster example's rows follow the speeds it measured: each worker's share of the
    # rows within 25 % of its share of the measured speed, as the run log has both at the
    # last partition. (The report's final speeds are measured after it: on this 2-core host
    # they moved by up to 30 % in a fit too short for a re-balance to pay.)
    report = re.findall(r"(worker-\d): (\d+) rows, ([\d,]+) rows/s", outputs[1])
    assert sorted(name for name, _, _ in report) == ["worker-0", "worker-1", "worker-2"]
    events = read_events(tmp_path / "runs" / "fit.jsonl")
    at = max(i for i, e in enumerate(events) if e["event"] == "partition")
    # The speeds it was planned from: each worker's latest score before it.
    speeds = {e["worker"]: e["score"] for e in events[:at] if e["event"] == "score"}
    rows = events[at]["rows"]
    assert rows == {name: int(n) for name, n, _ in report}, (rows, report)
    for name in rows:
        row_share = rows[name] / sum(rows.values())
        speed_share = speeds[name] / sum(speeds.values())
        # On a miss, the log's speeds and placements say why (source, fixed costs, round).
        plans = [e for e in events if e["event"] in ("score", "partition")]
        assert abs(row_share - speed_share) <= 0.25 * speed_share, (rows, speeds, plans)


def test_console_script_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["hmdspt"] == "hmdspt.cli:main"


def test_the_repository_is_ruff_clean():
    # The lint and format rules of pyproject.toml, over everything in the clone (ruff is in
    # the test extra for this); no cache: the tests write nothing into the clone.
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--no-cache", str(ROOT)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stdout + result.stderr
