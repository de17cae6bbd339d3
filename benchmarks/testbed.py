"""The testbed: a heterogeneous cluster on one machine whose speeds the KERNEL enforces.

Every slot of a :class:`Testbed` is a cgroup v1 pair (``cpu`` with a CFS quota of
``cores`` times the period, ``cpuacct`` to count what it used) and, with ``link_mbit``, a
network namespace behind a bridge with a token-bucket (``tc tbf``) link shaped in both
directions. Processes started with :meth:`Testbed.popen` run inside a slot; a Dask
scheduler and one worker per slot come from :meth:`Testbed.start_dask`. Nothing is emulated
in the project's code, so the project and any peer system run on the same workers see the
same machine. Figures from it are labelled ``testbed (OS-enforced CPU quotas)``.

It measures its own ceiling: :meth:`Testbed.check_quotas` (a busy numpy loop, each group
alone) and :meth:`Testbed.ceiling` (the training loop of ``hmdspt.core.nn``, each slot alone,
then all at once). Needs root, a writable cgroup v1 ``cpu`` and ``cpuacct`` controller and,
for links, ``ip``, ``tc`` and ``nsenter``. Traffic only ever goes to loopback or to
addresses inside namespaces the testbed made.

Teardown, however the run ends (``with`` block, :meth:`Testbed.teardown`, ``atexit``,
SIGTERM): processes by PID (each tracked process's whole process group, then anything
still inside the slots' groups or namespaces), namespaces, veth pairs, the bridge, cgroups.
A run killed with SIGKILL leaves its parts behind; :func:`cleanup_stale` removes those of
owners that are no longer alive.

Run: ``python -m benchmarks.testbed [--link-mbit 100]`` prints the quota check and the
ceiling for cores 1 / 0.5 / 0.25 at CFS periods of 100 ms and 10 ms, the link rate, and
checks that nothing of the testbed is left afterwards. See docs/testbed.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import errno
import fcntl
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CPUACCT_ROOT = Path("/sys/fs/cgroup/cpuacct")
NETNS_DIR = Path("/run/netns")
LABEL = "testbed (OS-enforced CPU quotas)"
NEEDS_ROOT = "needs root for cgroups and network namespaces"
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: A private /16 of which each live testbed with links takes one free /24.
SUBNET_PREFIX = "10.213"
SUBNET_LOCK = Path(tempfile.gettempdir()) / "hmdspt-testbed.lock"
#: ``cpu.shares`` of a testbed's parent group with ``reserve=True`` (the default is 1024,
#: as for every process of the root group): the quotas cap the slots, the weight makes the
#: kernel grant them their quota first on a machine busy with other work.
RESERVED_SHARES = 64 * 1024
#: The kernel's bounds for ``cpu.cfs_period_us`` and the least ``cpu.cfs_quota_us``.
PERIOD_US_RANGE = (1_000, 1_000_000)
MIN_QUOTA_US = 1_000
#: The training loop of :meth:`Testbed.ceiling`: the issue's model on its data's shape.
CEILING_MODEL = {"hidden": (128, 64), "n_features": 40, "n_classes": 10, "batch_size": 256}
# Moves the shell into both groups, then execs the command (same PID, so tracked as is).
_ENTER_GROUPS = 'echo $$ > "$1" && echo $$ > "$2" && shift 2 && exec "$@"'

_COUNTER = itertools.count()
_LIVE: list[Testbed] = []
_LIVE_LOCK = threading.RLock()
_HOOKS = {"atexit": False, "sigterm": False, "previous": None, "pending": None, "busy": 0}


class TestbedUnavailable(RuntimeError):
    """The machine cannot host the testbed (not root, no cgroup v1 controller, no ``ip``)."""

    __test__ = False  # not a pytest test class, whatever its name


def unavailable_reason(link: bool = False) -> str | None:
    """Why a testbed cannot start here (one line), or None if it can.

    Parameters
    ----------
    link : bool, default=False
        Also require what network namespaces and shaped links need (``ip``, ``tc``,
        ``nsenter``).
    """
    if os.geteuid() != 0:
        return f"{NEEDS_ROOT} (running as uid {os.geteuid()})"
    for root in (CPU_ROOT, CPUACCT_ROOT):
        probe = root / ("cpu.cfs_quota_us" if root == CPU_ROOT else "cpuacct.usage")
        if not probe.exists() or not os.access(root, os.W_OK):
            return f"{NEEDS_ROOT}: no writable cgroup v1 controller at {root} ({probe.name})"
    tools = ("ip", "tc", "nsenter") if link else ()
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"{NEEDS_ROOT}: {', '.join(missing)} not found on PATH"
    return None


@dataclasses.dataclass(frozen=True)
class Slot:
    """One worker's place on the testbed.

    Attributes
    ----------
    index : int
        Position in ``Testbed.slots``.
    name : str
        Worker name, e.g. ``"tb0-1.00c"`` (slot index and CPU quota in cores).
    cores : float
        CPU quota in cores (quota / period).
    cpu_cgroup, cpuacct_cgroup : Path
        The slot's group directories under the cgroup v1 ``cpu`` and ``cpuacct`` mounts.
    host : str
        Address a server in this slot binds and advertises (``127.0.0.1`` without links).
    netns : str or None
        Network namespace name, None without links.
    host_link, netns_link : str or None
        The veth ends: the bridge port (its tbf shapes what the slot receives) and the
        interface inside the namespace (its tbf shapes what the slot sends).
    """

    index: int
    name: str
    cores: float
    cpu_cgroup: Path
    cpuacct_cgroup: Path
    host: str
    netns: str | None = None
    host_link: str | None = None
    netns_link: str | None = None


def pin_slots(cores: Sequence[float], n_cpus: int) -> list[int]:
    """The CPU of each slot: the largest quotas first, each on the CPU with most room left.

    Examples
    --------
    >>> pin_slots((1.0, 0.5, 0.25), 2)
    [0, 1, 1]
    """
    room = [1.0] * max(int(n_cpus), 1)
    cpus = [0] * len(cores)
    for i in sorted(range(len(cores)), key=lambda i: -cores[i]):
        cpu = max(range(len(room)), key=lambda c: (room[c], -c))
        cpus[i] = cpu
        room[cpu] -= cores[i]
    return cpus


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def _write(path: Path, value: object) -> None:
    path.write_text(f"{value}\n")


def _pids_in(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _netns_pids(name: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _netns_names() -> list[str]:
    if shutil.which("ip") is None:
        return []
    proc = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _links() -> list[dict]:
    """Every link of the root namespace (``ip -j link``), with ``ifname`` and ``ifalias``."""
    if shutil.which("ip") is None:
        return []
    proc = _run(["ip", "-j", "link", "show"], check=False)
    return json.loads(proc.stdout or "[]") if proc.returncode == 0 else []


def _kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _rmdir(path: Path, attempts: int = 40) -> None:
    """Remove a cgroup directory, retrying while the kernel still counts exiting members."""
    for attempt in range(attempts):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == attempts - 1:
                raise
            time.sleep(0.05)


def _loadavg() -> tuple[float, float, float]:
    return tuple(round(x, 2) for x in os.getloadavg())


class Testbed:
    """A scheduler side and N worker slots whose CPU (and links) the kernel limits.

    A context manager: ``__enter__`` makes the cgroups (and with ``link_mbit`` the
    namespaces, veth pairs, bridge and tbf links), ``__exit__`` calls :meth:`teardown`.

    Parameters
    ----------
    cores : sequence of float, default=(1.0, 0.5, 0.25)
        CPU quota of each slot in cores (0.5 = half of one core's time per period).
    period_ms : float, default=100.0
        CFS period. 100 ms is the kernel's and Kubernetes' default: a quarter-core slot
        then runs 25 ms and waits 75 ms. 10 ms spreads the same share thinly, closer to a
        uniformly slower CPU.
    link_mbit : float, optional
        Put every slot in its own network namespace behind a bridge, its link shaped to this
        rate in both directions. None: every slot on the loopback, unshaped.
    prefix : str, default="hmdspt-tb"
        Start of every name the testbed makes; the owner's PID and a counter follow, so
        that concurrent or crashed runs do not collide (see :func:`cleanup_stale`).
    blas_threads : int, default=1
        ``OMP_NUM_THREADS`` etc. for every process started here.
    reserve : bool, default=True
        Give the testbed's groups a high CPU weight (``cpu.shares``) so that, on a machine
        busy with other work, each slot still gets its quota (the quota caps it).
    pin : bool, default=False
        Pin each slot's processes to CPUs of their own (:func:`pin_slots`: the largest
        quotas first, each on the CPU with the most quota left), as separate machines
        would be: a throttled slot's bursts then take nothing from the fastest slot. The
        driver and the scheduler stay unpinned. False: every slot may run on every CPU,
        so slots whose quotas add up past the host's cores compete within a period.

    Attributes
    ----------
    slots : list of Slot
    driver_host : str
        Address the scheduler and the driver bind and the workers dial: the bridge's own
        address with links, else ``127.0.0.1``.
    instance : str
        ``f"{prefix}-{pid}-{n}"``: the parent cgroup's name, the namespaces' prefix and the
        alias of every link made.
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(
        self,
        cores: Sequence[float] = (1.0, 0.5, 0.25),
        *,
        period_ms: float = 100.0,
        link_mbit: float | None = None,
        prefix: str = "hmdspt-tb",
        blas_threads: int = 1,
        reserve: bool = True,
        pin: bool = False,
    ) -> None:
        cores = tuple(float(c) for c in cores)
        if not cores or not all(c > 0 for c in cores):
            raise ValueError(f"cores must be one or more positive quotas, got {cores!r}")
        self.period_us = round(float(period_ms) * 1000)
        if not PERIOD_US_RANGE[0] <= self.period_us <= PERIOD_US_RANGE[1]:
            raise ValueError(f"period_ms must be between 1 and 1000 ms, got {period_ms!r}")
        self.quotas_us = [round(c * self.period_us) for c in cores]
        if min(self.quotas_us) < MIN_QUOTA_US:
            raise ValueError(
                f"a quota of {min(cores)} core at a {period_ms} ms period is "
                f"{min(self.quotas_us)} us, below the kernel's least quota of 1 ms"
            )
        if link_mbit is not None and not link_mbit > 0:
            raise ValueError(f"link_mbit must be > 0 or None, got {link_mbit!r}")
        if link_mbit is not None and len(cores) > 250:
            raise ValueError(
                f"a linked testbed holds at most 250 slots (one /24), got {len(cores)}"
            )
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", prefix):
            raise ValueError(f"prefix must be a name of letters, digits, _ . -, got {prefix!r}")
        if int(blas_threads) < 1:
            raise ValueError(f"blas_threads must be >= 1, got {blas_threads!r}")
        self.cores = cores
        self.period_ms = self.period_us / 1000
        self.link_mbit = None if link_mbit is None else float(link_mbit)
        self.prefix = prefix
        self.blas_threads = int(blas_threads)
        self.reserve = bool(reserve)
        self.cpus: list[int] | None = pin_slots(cores, os.cpu_count() or 1) if pin else None
        pid, n = os.getpid(), next(_COUNTER)
        self.instance = f"{prefix}-{pid}-{n}"
        self._tag = f"t{pid:x}x{n:x}"  # interface names: at most 15 characters
        self.slots: list[Slot] = []
        self.driver_host = "127.0.0.1"
        self.scheduler_address: str | None = None
        self.tmpdir: Path | None = None
        self.bridge: str | None = None
        self._procs: list[subprocess.Popen] = []
        self._made: dict[str, list] = {"cgroups": [], "netns": [], "links": []}
        self._started = False
        self._torn = False
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ setup
    def __enter__(self) -> Testbed:
        self.setup()
        return self

    def __exit__(self, *exc_info) -> None:
        self.teardown()

    def setup(self) -> None:
        """Make the groups (and the network); on any failure undo what was made and raise."""
        if self._started:
            raise RuntimeError(f"testbed {self.instance} was already started")
        reason = unavailable_reason(link=self.link_mbit is not None)
        if reason:
            raise TestbedUnavailable(reason)
        self._started = True
        _register(self)
        try:
            self.tmpdir = Path(tempfile.mkdtemp(prefix=f"{self.instance}-"))
            self._make_cgroups()
            if self.link_mbit is not None:
                self._make_network()
            else:
                self.slots = [self._slot(i) for i in range(len(self.cores))]
        except BaseException:
            self.teardown()
            raise

    def _slot(self, i: int, **net: Any) -> Slot:
        name = f"tb{i}-{self.cores[i]:.2f}c"
        return Slot(
            index=i,
            name=name,
            cores=self.cores[i],
            cpu_cgroup=CPU_ROOT / self.instance / name,
            cpuacct_cgroup=CPUACCT_ROOT / self.instance / name,
            host=net.pop("host", "127.0.0.1"),
            **net,
        )

    def _make_cgroups(self) -> None:
        for root in (CPU_ROOT, CPUACCT_ROOT):
            parent = root / self.instance
            parent.mkdir()
            self._made["cgroups"].append(parent)
        if self.reserve:
            _write(CPU_ROOT / self.instance / "cpu.shares", RESERVED_SHARES)
        for i in range(len(self.cores)):
            slot = self._slot(i)
            for group in (slot.cpu_cgroup, slot.cpuacct_cgroup):
                group.mkdir()
                self._made["cgroups"].insert(0, group)  # children are removed first
            _write(slot.cpu_cgroup / "cpu.cfs_period_us", self.period_us)
            _write(slot.cpu_cgroup / "cpu.cfs_quota_us", self.quotas_us[i])

    def _make_network(self) -> None:
        rate = f"{self.link_mbit:g}mbit"
        # The bucket must hold a timer tick's traffic (10 ms: HZ >= 100) or the rate is missed.
        burst = max(64 * 1024, int(self.link_mbit * 1e6 / 8 / 100))
        with open(SUBNET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two testbeds must not pick the same subnet
            net = self._free_subnet()
            self.bridge = f"{self._tag}b"
            self._made["links"].append(self.bridge)
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "link", "set", self.bridge, "alias", self.instance])
            _run(["ip", "addr", "add", f"{net}.1/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
        self.driver_host = f"{net}.1"
        for i in range(len(self.cores)):
            ns, outer, inner = f"{self.instance}-{i}", f"{self._tag}h{i}", f"{self._tag}n{i}"
            slot = self._slot(i, host=f"{net}.{i + 2}", netns=ns, host_link=outer, netns_link=inner)
            self._made["netns"].append(ns)
            _run(["ip", "netns", "add", ns])
            self._made["links"].insert(0, outer)
            _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
            _run(["ip", "link", "set", outer, "alias", self.instance])
            _run(["ip", "link", "set", inner, "netns", ns])
            _run(["ip", "link", "set", outer, "master", self.bridge])
            _run(["ip", "link", "set", outer, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{slot.host}/24", "dev", inner])
            _run(["ip", "-n", ns, "link", "set", inner, "up"])
            shape = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
            _run(["tc", "qdisc", "add", "dev", outer, *shape])  # what the slot receives
            _run(["tc", "-n", ns, "qdisc", "add", "dev", inner, *shape])  # what it sends
            self.slots.append(slot)

    @staticmethod
    def _free_subnet() -> str:
        proc = _run(["ip", "-j", "addr", "show"])
        used = {
            a["local"]
            for link in json.loads(proc.stdout or "[]")
            for a in link.get("addr_info", [])
            if a.get("family") == "inet"
        }
        taken = {int(a.split(".")[2]) for a in used if a.startswith(SUBNET_PREFIX + ".")}
        free = [k for k in range(1, 255) if k not in taken]
        if not free:
            raise RuntimeError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16 for a testbed")
        return f"{SUBNET_PREFIX}.{free[0]}"

    # -------------------------------------------------------------- processes
    @property
    def processes(self) -> list[subprocess.Popen]:
        """Every process started through :meth:`popen` (teardown ends them all)."""
        return list(self._procs)

    def _as_slot(self, slot: Slot | int | None) -> Slot | None:
        return self.slots[slot] if isinstance(slot, int) else slot

    def popen(
        self,
        slot: Slot | int | None,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.Popen:
        """Run ``argv`` in ``slot``'s cgroups (and namespace), tracked for teardown.

        Parameters
        ----------
        slot : Slot, int or None
            Where to run; None is the driver side (root cgroup, root namespace).
        argv : sequence of str
            The command.
        env : dict, optional
            Variables set over this process's environment (not a replacement of it).
            ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS`` are
            ``blas_threads``; the repository root leads ``PYTHONPATH``.
        **popen_kwargs
            Passed to :class:`subprocess.Popen`. The process always starts a new session,
            so that its PID is its process group and teardown ends the whole group.

        Returns
        -------
        subprocess.Popen
        """
        with self._lock:
            if not self._started or self._torn:
                raise RuntimeError(f"testbed {self.instance} is not running")
            slot = self._as_slot(slot)
            full_env = dict(os.environ)
            path = [str(ROOT), *filter(None, full_env.get("PYTHONPATH", "").split(os.pathsep))]
            full_env["PYTHONPATH"] = os.pathsep.join(path)
            full_env.update({var: str(self.blas_threads) for var in BLAS_VARS})
            full_env.update(env or {})
            command = list(argv)
            if slot is not None:
                enter_netns = ["nsenter", f"--net={NETNS_DIR / slot.netns}"] if slot.netns else []
                if self.cpus is not None:
                    command = ["taskset", "-c", str(self.cpus[slot.index]), *command]
                command = [
                    "sh",
                    "-c",
                    _ENTER_GROUPS,
                    "sh",
                    str(slot.cpu_cgroup / "cgroup.procs"),
                    str(slot.cpuacct_cgroup / "cgroup.procs"),
                    *enter_netns,
                    *command,
                ]
            popen_kwargs["start_new_session"] = True
            proc = subprocess.Popen(command, env=full_env, **popen_kwargs)
            self._procs.append(proc)
            return proc

    def start_dask(
        self,
        *,
        nthreads: int = 1,
        worker_args: Sequence[str] = (),
        scheduler_args: Sequence[str] = ("--no-dashboard",),
        nanny: bool = False,
        timeout: float = 60.0,
    ) -> str:
        """Start a ``dask scheduler`` on the driver side and one ``dask worker`` per slot.

        Each worker is named ``slot.name``, binds and advertises ``slot.host`` and runs
        without a nanny by default: a nanny would be a second process in the slot's group,
        taking its heartbeats and memory polls from the worker's quota, and would restart a
        killed worker behind the benchmark's back. With ``nanny=True`` the nanny runs inside
        the group too.

        Parameters
        ----------
        nthreads : int, default=1
            Threads per worker.
        worker_args, scheduler_args : sequence of str
            More arguments of ``dask worker`` / ``dask scheduler``.
        nanny : bool, default=False
            Start every worker under a nanny in its group.
        timeout : float, default=60.0
            Seconds to wait for the scheduler and every worker.

        Returns
        -------
        str
            The scheduler's address.
        """
        if self.scheduler_address is not None:
            raise RuntimeError(f"testbed {self.instance} already runs a scheduler")
        scheduler_file = self.tmpdir / "scheduler.json"
        logs = self.tmpdir / "logs"
        logs.mkdir(exist_ok=True)
        scheduler = self._popen_logged(
            None,
            [sys.executable, "-m", "dask", "scheduler", "--host", self.driver_host, "--port", "0"]
            + ["--scheduler-file", str(scheduler_file), *scheduler_args],
            logs / "scheduler.log",
        )
        deadline = time.monotonic() + timeout
        address = None
        while address is None:
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                address = json.loads(scheduler_file.read_text())["address"]
            if address is None:
                if scheduler.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dask scheduler did not start: {_tail(logs / 'scheduler.log')}"
                    )
                time.sleep(0.05)
        for slot in self.slots:
            self._popen_logged(
                slot,
                [sys.executable, "-m", "dask", "worker", address, "--name", slot.name]
                + ["--nthreads", str(nthreads), "--nanny" if nanny else "--no-nanny"]
                + ["--host", slot.host, "--no-dashboard"]
                + ["--local-directory", str(self.tmpdir / slot.name), *worker_args],
                logs / f"{slot.name}.log",
            )
        self.scheduler_address = address
        self._wait_for_workers(address, deadline, logs)
        return address

    def _popen_logged(self, slot: Slot | None, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "w") as stderr:  # the child holds its own copy of the descriptor
            return self.popen(slot, argv, stdout=subprocess.DEVNULL, stderr=stderr)

    def _wait_for_workers(self, address: str, deadline: float, logs: Path) -> None:
        from distributed import Client

        with Client(address, timeout=max(1.0, deadline - time.monotonic())) as client:
            want = {slot.name for slot in self.slots}
            while True:
                names = {w["name"] for w in client.scheduler_info()["workers"].values()}
                if want <= names:
                    return
                if time.monotonic() > deadline:
                    missing = sorted(want - names)
                    tails = "; ".join(f"{n}: {_tail(logs / f'{n}.log')}" for n in missing)
                    raise RuntimeError(f"workers {missing} did not connect: {tails}")
                time.sleep(0.1)

    # ----------------------------------------------------------- measurements
    def other_groups(self) -> list[str]:
        """Other top-level ``cpu`` groups with processes in them (another testbed, say).

        Their quotas and weights compete with this testbed's: a figure measured while one
        is busy is not this testbed's alone, so every measurement lists them.
        """
        if not CPU_ROOT.is_dir():
            return []
        return sorted(
            group.name
            for group in CPU_ROOT.iterdir()
            if group.is_dir()
            and group.name != self.instance
            and any(_pids_in(g) for g in [group, *group.rglob("*")] if g.is_dir())
        )

    def cpu_seconds(self, slot: Slot | int) -> float:
        """CPU seconds used so far by the processes of ``slot``'s group (``cpuacct.usage``)."""
        slot = self._as_slot(slot)
        return int((slot.cpuacct_cgroup / "cpuacct.usage").read_text()) / 1e9

    def cpu_stat(self, slot: Slot | int) -> dict[str, int]:
        """The slot's ``cpu.stat``: ``nr_periods``, ``nr_throttled``, ``throttled_time`` ..."""
        slot = self._as_slot(slot)
        lines = (slot.cpu_cgroup / "cpu.stat").read_text().split("\n")
        return {k: int(v) for k, v in (line.split() for line in lines if line.strip())}

    def check_quotas(self, seconds: float = 2.0, *, together: bool = False) -> dict[str, Any]:
        """Run the same busy numpy loop (a 256 x 256 float32 matmul) in each slot's group.

        Parameters
        ----------
        seconds : float, default=2.0
            Wall seconds of loop per slot.
        together : bool, default=False
            Run all slots at once instead of one slot at a time.

        Returns
        -------
        dict
            ``slots``: per slot ``name``, ``cores`` (quota), ``rate`` (loop iterations per
            wall second), ``cores_used`` (``cpuacct`` seconds per wall second),
            ``throttled`` (share of CFS periods in which the group hit its quota) and the
            ratios of ``rate``, ``cores_used`` and the quota to the slowest slot's
            (``rate_ratio``, ``used_ratio``, ``quota_ratio``); and ``period_ms``,
            ``seconds``, ``together``, ``loadavg`` (before, after) and ``other_groups``
            (see :meth:`other_groups`, before or after).
        """
        before, others = _loadavg(), self.other_groups()
        with self._children("matmul", {}) as children:
            phases = self._run_children(children, seconds, together)
        return {
            "period_ms": self.period_ms,
            "seconds": seconds,
            "together": together,
            "loadavg": (before, _loadavg()),
            "other_groups": sorted({*others, *self.other_groups()}),
            "slots": _with_ratios(phases, "rate"),
        }

    def ceiling(
        self,
        seconds: float = 3.0,
        *,
        hidden: Sequence[int] = CEILING_MODEL["hidden"],
        n_features: int = CEILING_MODEL["n_features"],
        n_classes: int = CEILING_MODEL["n_classes"],
        batch_size: int = CEILING_MODEL["batch_size"],
    ) -> dict[str, Any]:
        """Each slot's training speed alone, then all slots at once: the testbed's ceiling.

        The loop is ``hmdspt.core.nn.minibatch_pass`` (row gather included) of an MLP
        ``(n_features, *hidden, n_classes)`` with Adam in float32 on synthetic rows.

        Returns
        -------
        dict
            ``alone`` and ``together``: per slot ``name``, ``cores``, ``rate`` (rows per
            second), ``cores_used``, ``throttled`` and ratios to the slowest slot;
            ``combined`` (the sum of the together rates), ``fastest_alone``, ``ratio``
            (``combined / fastest_alone``: what the whole testbed can give over its fastest
            worker), ``quota_ratio`` (the same for the quotas: ``sum(cores) / max(cores)``),
            ``loadavg`` (before, after) and ``other_groups``.
        """
        params = {
            "layer_sizes": [int(n_features), *map(int, hidden), int(n_classes)],
            "batch_size": int(batch_size),
        }
        before, others = _loadavg(), self.other_groups()
        with self._children("train", params) as children:
            alone = self._run_children(children, seconds, together=False)
            together = self._run_children(children, seconds, together=True)
        combined = sum(s["rate"] for s in together)
        fastest = max(s["rate"] for s in alone)
        return {
            "period_ms": self.period_ms,
            "seconds": seconds,
            "model": params,
            "alone": _with_ratios(alone, "rate"),
            "together": _with_ratios(together, "rate"),
            "combined": combined,
            "fastest_alone": fastest,
            "ratio": combined / fastest,
            "quota_ratio": sum(self.cores) / max(self.cores),
            "loadavg": (before, _loadavg()),
            "other_groups": sorted({*others, *self.other_groups()}),
        }

    def measure_link(
        self, slot: Slot | int = 0, *, megabytes: float | None = None
    ) -> dict[str, Any]:
        """Timed bulk transfers over TCP between the driver side and ``slot``, both ways.

        Both ends bind addresses the testbed made (``driver_host``, ``slot.host``). The rate
        counts from the first byte received to the last.

        Parameters
        ----------
        slot : Slot or int, default=0
        megabytes : float, optional
            Bytes per transfer (MB); default about two seconds at ``link_mbit`` (32 MB
            without a shaped link).

        Returns
        -------
        dict
            ``to_slot_mbit``, ``from_slot_mbit``, ``megabytes``, ``link_mbit``, ``slot``,
            ``loadavg`` (before, after) and ``other_groups``.
        """
        slot = self._as_slot(slot)
        if megabytes is None:
            megabytes = 32.0 if self.link_mbit is None else self.link_mbit * 2 / 8
        n_bytes = int(megabytes * 1e6)
        before, others = _loadavg(), self.other_groups()
        with self._children("link", {"host": slot.host}, slots=[slot]) as children:
            child = children[0]
            port = int(child.ready.split()[1])
            _send_line(child.proc, "recv")
            with socket.create_connection(
                (slot.host, port), source_address=(self.driver_host, 0)
            ) as s:
                _send_bytes(s, n_bytes)
            received = json.loads(child.proc.stdout.readline())
            _send_line(child.proc, f"send {n_bytes}")
            with socket.create_connection(
                (slot.host, port), source_address=(self.driver_host, 0)
            ) as s:
                got, wall = _receive_all(s)
            _send_line(child.proc, "quit")
        return {
            "slot": slot.name,
            "link_mbit": self.link_mbit,
            "megabytes": megabytes,
            "to_slot_mbit": received["bytes"] * 8 / received["wall_s"] / 1e6,
            "from_slot_mbit": got * 8 / wall / 1e6,
            "loadavg": (before, _loadavg()),
            "other_groups": sorted({*others, *self.other_groups()}),
        }

    @contextlib.contextmanager
    def _children(self, kind: str, params: dict, slots: Sequence[Slot] | None = None):
        """One measuring child per slot, started together, each ready (imports done)."""
        slots = list(self.slots if slots is None else slots)
        code = f"from benchmarks.testbed import _child; _child({kind!r}, {json.dumps(params)!r})"
        children = []
        try:
            for slot in slots:
                proc = self.popen(
                    slot,
                    [sys.executable, "-c", code],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    bufsize=1,
                )
                children.append(_Child(slot, proc))
            for child in children:
                child.ready = child.proc.stdout.readline().strip()
                if not child.ready.startswith("ready"):
                    raise RuntimeError(f"{kind} child in {child.slot.name} did not start")
            yield children
        finally:
            for child in children:
                with contextlib.suppress(OSError):
                    child.proc.stdin.close()
                try:
                    child.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(child.proc.pid, signal.SIGKILL)
                    child.proc.wait()
                child.proc.stdout.close()

    def _run_children(self, children: list[_Child], seconds: float, together: bool) -> list[dict]:
        """Time ``seconds`` of each child's loop, one after the other or all at once."""
        results: list[dict] = []
        batches = [children] if together else [[c] for c in children]
        for batch in batches:
            started = {}
            for child in batch:
                started[child] = (time.perf_counter(), self.cpu_seconds(child.slot))
                child.stat0 = self.cpu_stat(child.slot)
                _send_line(child.proc, f"run {seconds}")
            with selectors.DefaultSelector() as sel:
                for child in batch:
                    sel.register(child.proc.stdout, selectors.EVENT_READ, child)
                pending = len(batch)
                while pending:
                    events = sel.select(timeout=seconds * 20 + 60)
                    if not events:
                        raise RuntimeError(f"measuring children gave no result in {seconds} s")
                    for key, _ in events:
                        child = key.data
                        line = child.proc.stdout.readline()
                        wall = time.perf_counter() - started[child][0]
                        cpu = self.cpu_seconds(child.slot) - started[child][1]
                        stat = self.cpu_stat(child.slot)
                        sel.unregister(key.fileobj)
                        pending -= 1
                        if not line:
                            raise RuntimeError(f"measuring child in {child.slot.name} died")
                        out = json.loads(line)
                        periods = stat["nr_periods"] - child.stat0["nr_periods"]
                        throttled = stat["nr_throttled"] - child.stat0["nr_throttled"]
                        child.result = {
                            "name": child.slot.name,
                            "cores": child.slot.cores,
                            "rate": out["units"] / out["wall_s"],
                            "cores_used": cpu / wall,
                            "throttled": throttled / periods if periods else 0.0,
                        }
            results.extend(child.result for child in batch)
        return results

    # --------------------------------------------------------------- teardown
    def teardown(self) -> list[str]:
        """End every process of the testbed and remove everything it made. Idempotent.

        Processes first (SIGTERM to each tracked process group, SIGKILL after a grace,
        then SIGKILL to anything still in the slots' groups or namespaces, all by PID),
        then namespaces, links, bridge, cgroups and the temporary directory.

        Returns
        -------
        list of str
            What could not be removed (empty when clean); also warned about.
        """
        with _teardown_running():  # from here a SIGTERM waits until the teardown is done
            with self._lock:
                if self._torn or not self._started:
                    self._torn = True
                    return []
                self._torn = True
            problems = self._teardown()
            _unregister(self)
        if problems:
            warnings.warn(f"testbed {self.instance} teardown: {'; '.join(problems)}", stacklevel=2)
        return problems

    def _teardown(self) -> list[str]:
        problems: list[str] = []
        running = [p for p in self._procs if p.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in running:
            if proc.poll() is None:  # not yet reaped, so its PID is still its group's
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5.0)
        # Anything that left its process group but not its cgroup or namespace.
        for _ in range(50):
            stray = [pid for slot in self.slots for pid in self._slot_pids(slot)]
            if not stray:
                break
            _kill_pids(stray)
            time.sleep(0.05)
        for ns in self._made["netns"]:
            if ns in _netns_names():
                _run(["ip", "netns", "delete", ns], check=False)
        existing = {link.get("ifname") for link in _links()}
        for link in self._made["links"]:
            if link in existing:
                _run(["ip", "link", "delete", link], check=False)
        for group in self._made["cgroups"]:
            try:
                _rmdir(group)
            except OSError as exc:
                problems.append(f"cgroup {group} not removed: {exc}")
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        left = self.leftovers()
        problems += [f"{kind} left: {items}" for kind, items in left.items() if items]
        return problems

    def _slot_pids(self, slot: Slot) -> list[int]:
        pids = _pids_in(slot.cpu_cgroup) + _pids_in(slot.cpuacct_cgroup)
        if slot.netns and slot.netns in _netns_names():
            pids += _netns_pids(slot.netns)
        return sorted(set(pids))

    def leftovers(self) -> dict[str, list]:
        """What of this testbed still exists: cgroups, namespaces, links, live tracked PIDs."""
        return {
            "cgroups": [str(g) for g in self._made["cgroups"] if g.exists()],
            "netns": [ns for ns in _netns_names() if ns.startswith(self.instance + "-")],
            "links": [link["ifname"] for link in _links() if link.get("ifalias") == self.instance],
            "pids": [p.pid for p in self._procs if p.poll() is None],
        }


@dataclasses.dataclass(eq=False)
class _Child:
    slot: Slot
    proc: subprocess.Popen
    ready: str = ""
    stat0: dict = dataclasses.field(default_factory=dict)
    result: dict = dataclasses.field(default_factory=dict)


def _with_ratios(rows: list[dict], key: str) -> list[dict]:
    slowest = min(rows, key=lambda r: r["cores"])
    for row in rows:
        row["rate_ratio"] = row[key] / slowest[key]
        row["used_ratio"] = row["cores_used"] / slowest["cores_used"]
        row["quota_ratio"] = row["cores"] / slowest["cores"]
    return rows


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:]) or "(empty log)"
    except FileNotFoundError:
        return "(no log)"


def _send_line(proc: subprocess.Popen, line: str) -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _send_bytes(sock: socket.socket, n_bytes: int) -> None:
    block = b"\0" * (1 << 20)
    view = memoryview(block)
    while n_bytes > 0:
        n_bytes -= sock.send(view[: min(len(block), n_bytes)])
    sock.shutdown(socket.SHUT_WR)


def _receive_all(sock: socket.socket) -> tuple[int, float]:
    """Bytes received until EOF, and the seconds from the first byte to the last."""
    buffer = bytearray(1 << 20)
    total, first, last = 0, None, None
    while n := sock.recv_into(buffer):
        last = time.perf_counter()
        first = first if first is not None else last
        total += n
    return total, (last - first) if total else float("nan")


# ------------------------------------------------------------ measuring children
def _child(kind: str, params_json: str) -> None:
    """Body of a measuring process in a slot: say ``ready``, then obey stdin's commands.

    ``run S`` runs the loop of ``kind`` for S wall seconds and prints one JSON line
    (``units``, ``wall_s``); ``kind="link"`` serves ``recv`` / ``send N`` transfers.
    """
    params = json.loads(params_json)
    if kind == "link":
        return _link_child(params["host"])
    step = _matmul_step() if kind == "matmul" else _train_step(**params)
    for _ in range(3):  # warm-up: buffers, caches, lazy imports
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.split()
        if command and command[0] == "run":
            seconds, units = float(command[1]), 0
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                units += step()
            wall = time.perf_counter() - start
            print(json.dumps({"units": units, "wall_s": wall}), flush=True)


def _matmul_step():
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 256), dtype=np.float32) for _ in range(2))
    out = np.empty_like(a)

    def step() -> int:
        np.matmul(a, b, out=out)
        return 1

    return step


def _train_step(layer_sizes: Sequence[int], batch_size: int, n_rows: int = 16_384):
    import numpy as np

    from hmdspt.core.nn import MLP, AdamOptimizer, BatchBuffers, minibatch_pass

    rng = np.random.RandomState(0)
    model = MLP(layer_sizes)
    model.initialize(rng)
    optimizer = AdamOptimizer(model.n_params, dtype=model.dtype)
    X = rng.standard_normal((n_rows, layer_sizes[0])).astype(np.float32)
    Y = np.eye(layer_sizes[-1], dtype=np.float32)[rng.randint(layer_sizes[-1], size=n_rows)]
    order = rng.permutation(n_rows)
    buffers = BatchBuffers(batch_size, X.shape[1], Y.shape[1], X.dtype)
    chunk = 8 * batch_size  # a few ms of work: the loop checks the clock this often
    position = [0]

    def step() -> int:
        start = position[0]
        rows = order[start : start + chunk]
        minibatch_pass(model, optimizer, X, Y, rows, batch_size, buffers)
        position[0] = (start + chunk) % (n_rows - n_rows % chunk or n_rows)
        return len(rows)

    return step


def _link_child(host: str) -> None:
    with socket.socket() as server:
        server.bind((host, 0))
        server.listen(1)
        print(f"ready {server.getsockname()[1]}", flush=True)
        for line in sys.stdin:
            command = line.split()
            if not command or command[0] == "quit":
                break
            conn, _ = server.accept()
            with conn:
                if command[0] == "recv":
                    total, wall = _receive_all(conn)
                    print(json.dumps({"bytes": total, "wall_s": wall}), flush=True)
                else:
                    _send_bytes(conn, int(command[1]))


# ------------------------------------------------------------ teardown hooks
def _register(testbed: Testbed) -> None:
    with _LIVE_LOCK:
        _LIVE.append(testbed)
        if not _HOOKS["atexit"]:
            atexit.register(teardown_all)
            _HOOKS["atexit"] = True
        if not _HOOKS["sigterm"] and threading.current_thread() is threading.main_thread():
            _HOOKS["previous"] = signal.signal(signal.SIGTERM, _on_sigterm)
            _HOOKS["sigterm"] = True


def _unregister(testbed: Testbed) -> None:
    with _LIVE_LOCK, contextlib.suppress(ValueError):
        _LIVE.remove(testbed)


def teardown_all() -> None:
    """Tear down every testbed of this process that is still up (atexit, SIGTERM)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for testbed in live:
        testbed.teardown()


@contextlib.contextmanager
def _teardown_running():
    """While a teardown runs, a SIGTERM waits for it to finish (see :func:`_on_sigterm`)."""
    _HOOKS["busy"] += 1
    try:
        yield
    finally:
        _HOOKS["busy"] -= 1
        if not _HOOKS["busy"] and _HOOKS["pending"] is not None:
            pending, _HOOKS["pending"] = _HOOKS["pending"], None
            _deliver(pending)


def _on_sigterm(signum, frame) -> None:
    if _HOOKS["busy"]:  # the teardown under way ends, then the signal is delivered
        _HOOKS["pending"] = (signum, frame)
        return
    teardown_all()
    _deliver((signum, frame))


def _deliver(signal_and_frame) -> None:
    signum, frame = signal_and_frame
    previous = _HOOKS["previous"]
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)  # die of the signal, as without the testbed
        os.kill(os.getpid(), signum)


# ------------------------------------------------------------ stale leftovers
def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = "hmdspt-tb") -> list[str]:
    """Remove what killed earlier testbeds named ``prefix-PID-N`` left behind.

    Only parts whose owner PID is no longer alive are touched: their processes (by PID,
    from the groups' and namespaces' member lists), namespaces, links (found by the alias
    the testbed gives them), cgroups and temporary directories.

    Returns
    -------
    list of str
        What was removed.
    """
    pattern = re.compile(rf"^({re.escape(prefix)}-(\d+)-\d+)(-\d+)?$")

    def stale(name: str) -> str | None:
        m = pattern.match(name)
        return m.group(1) if m and not _owner_alive(int(m.group(2))) else None

    removed: list[str] = []
    groups = [
        (parent, sorted(p for p in parent.iterdir() if p.is_dir()))
        for root in (CPU_ROOT, CPUACCT_ROOT)
        if root.is_dir()
        for parent in root.iterdir()
        if parent.is_dir() and stale(parent.name)
    ]
    namespaces = [ns for ns in _netns_names() if stale(ns)]
    for _ in range(50):
        members = [pid for _, children in groups for c in children for pid in _pids_in(c)]
        members += [pid for ns in namespaces for pid in _netns_pids(ns)]
        if not members:
            break
        _kill_pids(members)
        removed += [f"process {pid}" for pid in members]
        time.sleep(0.05)
    for ns in namespaces:
        _run(["ip", "netns", "delete", ns], check=False)
        removed.append(f"netns {ns}")
    for link in _links():
        alias = link.get("ifalias") or ""
        if stale(alias):
            _run(["ip", "link", "delete", link["ifname"]], check=False)
            removed.append(f"link {link['ifname']}")
    for parent, children in groups:
        for group in [*children, parent]:
            with contextlib.suppress(OSError):  # still busy: the next cleanup retries
                _rmdir(group)
                removed.append(f"cgroup {group}")
    for tmp in Path(tempfile.gettempdir()).glob(f"{prefix}-*"):
        name = tmp.name.rsplit("-", 1)[0]  # mkdtemp appends a random suffix
        if tmp.is_dir() and stale(name):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(f"directory {tmp}")
    return sorted(set(removed), key=removed.index)


def leftovers(prefix: str = "hmdspt-tb") -> dict[str, list[str]]:
    """Everything on the machine named like a testbed of ``prefix`` (any owner)."""
    pattern = re.compile(rf"^{re.escape(prefix)}-\d+-\d+(-\d+)?$")
    return {
        "cgroups": [
            str(parent)
            for root in (CPU_ROOT, CPUACCT_ROOT)
            if root.is_dir()
            for parent in root.iterdir()
            if parent.is_dir() and pattern.match(parent.name)
        ],
        "netns": [ns for ns in _netns_names() if pattern.match(ns)],
        "links": [link["ifname"] for link in _links() if pattern.match(link.get("ifalias") or "")],
    }


# ------------------------------------------------------------ the benchmark
def _print_rows(title: str, rows: list[dict], unit: str) -> None:
    print(title)
    print(
        f"  {'slot':<10s} {'quota':>6s} {unit:>11s} {'cores used':>11s} {'throttled':>10s} "
        f"{'rate ratio':>11s} {'used ratio':>11s} {'quota ratio':>12s}"
    )
    for r in rows:
        print(
            f"  {r['name']:<10s} {r['cores']:6.2f} {r['rate']:11.0f} {r['cores_used']:11.3f} "
            f"{100 * r['throttled']:9.0f}% {r['rate_ratio']:11.2f} {r['used_ratio']:11.2f} "
            f"{r['quota_ratio']:12.2f}"
        )


def _load(result: dict) -> str:
    (before, *_), (after, *_) = result["loadavg"]
    text = f"load average {before:.2f} -> {after:.2f} (1 min)"
    if result.get("other_groups"):
        text += f"; NOT ALONE: other cpu groups busy: {', '.join(result['other_groups'])}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", default="1,0.5,0.25", help="quota per slot (default 1,0.5,0.25)")
    parser.add_argument("--periods-ms", default="100,10", help="CFS periods (default 100,10)")
    parser.add_argument("--quota-seconds", type=float, default=2.0)
    parser.add_argument("--ceiling-seconds", type=float, default=3.0)
    parser.add_argument("--link-mbit", type=float, default=None, help="also shape and measure")
    parser.add_argument("--no-reserve", action="store_true", help="leave cpu.shares at 1024")
    args = parser.parse_args(argv)
    cores = tuple(float(c) for c in args.cores.split(","))
    periods = [float(p) for p in args.periods_ms.split(",")]
    reason = unavailable_reason(link=args.link_mbit is not None)
    if reason:
        print(f"# {LABEL}\nnot run: {reason}")
        return 2
    from ._common import header

    header(f"{LABEL}: quota check, ceiling, link")
    print(
        f"every process in a slot: {', '.join(BLAS_VARS)}=1 (the BLAS line above is the "
        "driver's own)"
    )
    print(f"stale leftovers removed first: {cleanup_stale() or 'none'}")
    made: list[Testbed] = []
    for period in periods:
        tb = Testbed(cores, period_ms=period, link_mbit=args.link_mbit, reserve=not args.no_reserve)
        made.append(tb)
        with tb:
            print(
                f"\n## CFS period {tb.period_ms:g} ms, quotas "
                f"{' / '.join(f'{c:g}' for c in cores)} core, cpu.shares "
                f"{'reserved' if tb.reserve else 'default'}"
            )
            q = tb.check_quotas(args.quota_seconds)
            _print_rows(
                f"quota check: 256x256 float32 matmul loop, {args.quota_seconds:g} s alone in "
                f"each group; {_load(q)}",
                q["slots"],
                "iter/s",
            )
            c = tb.ceiling(args.ceiling_seconds)
            hidden = tuple(c["model"]["layer_sizes"][1:-1])
            for phase in ("alone", "together"):
                _print_rows(
                    f"ceiling, {phase}: hmdspt.core.nn minibatch_pass, MLP {hidden} on "
                    f"{c['model']['layer_sizes'][0]} features, batch {c['model']['batch_size']},"
                    f" Adam, float32, {args.ceiling_seconds:g} s"
                    + (" in each slot alone" if phase == "alone" else " in all slots at once"),
                    c[phase],
                    "rows/s",
                )
            print(
                f"combined ceiling: {c['combined']:.0f} rows/s together = {c['ratio']:.2f} x "
                f"the fastest slot alone ({c['fastest_alone']:.0f} rows/s); quotas allow "
                f"{c['quota_ratio']:.2f} x; {_load(c)}"
            )
            if args.link_mbit is not None and period == periods[0]:
                link = tb.measure_link(0)
                print(
                    f"link: tbf {args.link_mbit:g} Mbit/s both ways; {link['megabytes']:g} MB "
                    f"over TCP driver -> {link['slot']}: {link['to_slot_mbit']:.1f} Mbit/s, "
                    f"{link['slot']} -> driver: {link['from_slot_mbit']:.1f} Mbit/s; "
                    f"{_load(link)}"
                )
    left = {kind: items for tb in made for kind, items in tb.leftovers().items() if items}
    left_any = {kind: items for kind, items in leftovers().items() if items}
    print(f"\nleft behind by these testbeds: {left or 'nothing'}")
    print(f"left behind by any testbed of this prefix: {left_any or 'nothing'}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
