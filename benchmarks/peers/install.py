"""The peers' own environment: a venv with torch (CPU), pyspark and numpy, and a Java.

The peers are never dependencies of the package: the benchmark installs them here, into
``$HMDSPT_PEERS_ENV`` (default ``~/.cache/hmdspt-peers``), once. Running it again checks
the environment and does nothing if it is complete. Java comes from Debian
(``default-jre-headless``) when no ``java`` is on the path, and so does the native BLAS
Spark's MLlib uses (``libopenblas0-pthread``) when the system has no ``libblas.so.3``.

Run: ``python -m benchmarks.peers.install``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0"
PACKAGES = (TORCH, "numpy", "pyspark")
NATIVE_BLAS = "libopenblas0-pthread"  # Debian's; provides libblas.so.3
ENV_DIR = Path(os.environ.get("HMDSPT_PEERS_ENV", Path.home() / ".cache" / "hmdspt-peers"))
INSTALL_TIMEOUT_S = 1800.0
# Prints the versions, and fails if the torch build is not the CPU one.
_CHECK = (
    "import json, numpy, pyspark, torch; "
    "assert torch.version.cuda is None, f'torch {torch.__version__} is a CUDA build'; "
    "print(json.dumps({'torch': torch.__version__, 'pyspark': pyspark.__version__, "
    "'numpy': numpy.__version__}))"
)


def venv_python(env_dir: Path = ENV_DIR) -> Path:
    """The venv's interpreter (it may not exist yet)."""
    return env_dir / "bin" / "python"


def spark_home(env_dir: Path = ENV_DIR) -> Path:
    """``SPARK_HOME`` of the venv's pyspark (its ``bin/spark-class`` starts the daemons)."""
    done = subprocess.run(
        [str(venv_python(env_dir)), "-c", "import pyspark; print(pyspark.__path__[0])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return Path(done.stdout.strip())


def installed_versions(env_dir: Path = ENV_DIR) -> dict[str, str] | None:
    """Versions of torch, pyspark and numpy in the venv, or None if it is not complete."""
    import json

    python = venv_python(env_dir)
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _apt_install(package: str, echo=print) -> None:
    echo(f"apt-get install -y {package}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", package],
    ):
        subprocess.run(argv, check=True, env=env, timeout=INSTALL_TIMEOUT_S)


def ensure_java(echo=print) -> str:
    """Path of ``java``, installing Debian's ``default-jre-headless`` if there is none."""
    java = shutil.which("java")
    if java:
        return java
    _apt_install("default-jre-headless", echo)
    java = shutil.which("java")
    if not java:
        raise RuntimeError("default-jre-headless installed but no java on the path")
    return java


def has_native_blas() -> bool:
    """Whether the dynamic linker knows a ``libblas.so.3`` (Spark's native BLAS)."""
    done = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=60)
    return "libblas.so.3 " in done.stdout


def ensure_native_blas(echo=print) -> None:
    """Debian's OpenBLAS as the system ``libblas.so.3``, which Spark's MLlib loads.

    Without one, MLlib falls back to BLAS written in Java; Spark's MLlib guide asks for
    a native one.
    """
    if not has_native_blas():
        _apt_install(NATIVE_BLAS, echo)


def ensure_env(env_dir: Path = ENV_DIR, echo=print) -> dict[str, str]:
    """Create the venv and install the peers into it unless it is complete already.

    Returns
    -------
    dict
        The installed versions of torch, pyspark and numpy.
    """
    versions = installed_versions(env_dir)
    if versions is not None:
        return versions
    python = venv_python(env_dir)
    if not python.exists():
        echo(f"creating the peers' venv in {env_dir}")
        subprocess.run(
            [sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=INSTALL_TIMEOUT_S
        )
    echo(f"installing {' '.join(PACKAGES)} into {env_dir} (once)")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *PACKAGES],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    versions = installed_versions(env_dir)
    if versions is None:
        done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True)
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"the peers' venv in {env_dir} is incomplete: {last}")
    return versions


def main() -> int:
    print(f"java: {ensure_java()}")
    ensure_native_blas()
    print(f"native BLAS for Spark: {has_native_blas()}")
    print(f"peers' venv {ENV_DIR}: {ensure_env()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
