"""The OS-enforced testbed (``benchmarks/testbed.py``): quotas hold, Dask runs on it, and
nothing of it is left afterwards, however it ends.

Needs root for cgroups and network namespaces: skipped without it, and a failure instead when
``HMDSPT_REQUIRE_ALL`` is set (CI runs the suite as root with it set).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import testbed
from tests.requires import missing

pytestmark = pytest.mark.heavy(12)

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "hmdspt-tbtest"  # only this file's testbeds; a stale-run cleanup touches no others
PERIOD_MS = 10.0
QUOTA_SECONDS = 1.0
# Loose enough for partial periods at a window's ends (docs/testbed.md has the spread),
# tight enough to fail without quotas (ratio 1) or with a quota one step off (1 or 4).
RATIO_TOLERANCE = 0.10
OVER_QUOTA_TOLERANCE = 0.05


def require_testbed(link: bool = False) -> None:
    reason = testbed.unavailable_reason(link=link)
    if reason:
        missing(reason)


@pytest.fixture(autouse=True)
def _no_stale_runs():
    yield
    testbed.cleanup_stale(PREFIX)  # a failed test's killed child must not leave parts behind


def _alive(pids) -> list[int]:
    """The PIDs still running: a zombie has ended (an orphan's waits for init to reap it)."""
    alive = []
    for pid in map(int, pids):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _shell(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def assert_nothing_left(instance: str, pids) -> None:
    """No cgroup, namespace, link or process of the testbed ``instance`` exists."""
    assert not (testbed.CPU_ROOT / instance).exists()
    assert not (testbed.CPUACCT_ROOT / instance).exists()
    assert instance not in _shell("ip", "netns", "list")
    assert instance not in _shell("ip", "-d", "link", "show")  # every link has it as alias
    assert _alive(pids) == []


def _cpu_group(cgroup_file: str) -> str:
    """The cpu controller's group of a process, from its ``/proc/PID/cgroup``."""
    return next(line.split(":", 2)[2] for line in cgroup_file.splitlines() if ":cpu:" in line)


def _run_on(client, worker: str, fn, *args):
    return client.submit(fn, *args, workers=[worker], allow_other_workers=False, pure=False)


def test_two_worker_testbed_quotas_hold_dask_runs_and_teardown_leaves_nothing(machine_alone):
    require_testbed()
    from distributed import Client

    tb = testbed.Testbed((0.5, 0.25), period_ms=PERIOD_MS, prefix=PREFIX)
    with tb:
        with machine_alone():  # the kernel's shares of the cores, not another test's
            quotas = tb.check_quotas(QUOTA_SECONDS)
        fast, slow = quotas["slots"]
        assert fast["used_ratio"] == pytest.approx(2.0, rel=RATIO_TOLERANCE), quotas
        for slot in quotas["slots"]:
            assert slot["cores_used"] <= slot["cores"] * (1 + OVER_QUOTA_TOLERANCE), quotas
            assert slot["throttled"] > 0.5, quotas  # the kernel, not the loop, set the pace

        address = tb.start_dask()
        with Client(address) as client:
            by_name = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
            assert sorted(by_name) == sorted(slot.name for slot in tb.slots)
            worker_pids = []
            for slot in tb.slots:
                worker = by_name[slot.name]
                group = _run_on(client, worker, Path.read_text, Path("/proc/self/cgroup"))
                assert _cpu_group(group.result()) == f"/{tb.instance}/{slot.name}"
                worker_pids.append(_run_on(client, worker, os.getpid).result())
        tracked = [proc.pid for proc in tb.processes]
        assert _alive(worker_pids) == worker_pids
    assert_nothing_left(tb.instance, tracked + worker_pids)
    assert tb.teardown() == []  # idempotent


def test_linked_testbed_shapes_both_directions_and_workers_talk_across_the_bridge():
    require_testbed(link=True)
    from distributed import Client

    # Quotas large enough that the workers start in a second or two: only links are checked.
    tb = testbed.Testbed((1.0, 0.5), period_ms=PERIOD_MS, link_mbit=50, prefix=PREFIX)
    with tb:
        for slot in tb.slots:
            assert "tbf" in (into := _shell("tc", "qdisc", "show", "dev", slot.host_link))
            assert "rate 50Mbit" in into
            out = _shell("tc", "-n", slot.netns, "qdisc", "show", "dev", slot.netns_link)
            assert "tbf" in out and "rate 50Mbit" in out
        address = tb.start_dask()
        assert address.startswith(f"tcp://{tb.driver_host}:")
        with Client(address) as client:
            workers = client.scheduler_info()["workers"]
            by_name = {w["name"]: a for a, w in workers.items()}
            for slot in tb.slots:
                worker = by_name[slot.name]
                assert worker.startswith(f"tcp://{slot.host}:")
                netns = _run_on(client, worker, os.readlink, "/proc/self/ns/net").result()
                assert netns == f"net:[{os.stat(testbed.NETNS_DIR / slot.netns).st_ino}]"
            # Data made on one worker reaches the other through both shaped links.
            first, second = (by_name[slot.name] for slot in tb.slots)
            made = _run_on(client, first, bytes, 200_000)
            assert _run_on(client, second, len, made).result() == 200_000
        tracked = [proc.pid for proc in tb.processes]
    assert_nothing_left(tb.instance, tracked)


def _owner() -> subprocess.Popen:
    """A process that makes a linked testbed with a ``sleep`` in each slot, then waits."""
    code = textwrap.dedent(
        f"""
        import time
        from benchmarks.testbed import Testbed
        tb = Testbed((0.5, 0.25), link_mbit=10, prefix={PREFIX!r})
        tb.setup()
        sleepers = [tb.popen(slot, ["sleep", "600"]) for slot in tb.slots]
        print(tb.instance, *[p.pid for p in sleepers], flush=True)
        time.sleep(600)
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )


def test_sigterm_to_the_owner_tears_the_testbed_down():
    require_testbed(link=True)
    owner = _owner()
    try:
        instance, *sleepers = owner.stdout.readline().split()
        assert (testbed.CPU_ROOT / instance).exists() and _alive(sleepers) == list(
            map(int, sleepers)
        )
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=60) == -signal.SIGTERM  # it still dies of the signal
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    assert_nothing_left(instance, sleepers)


def test_cleanup_stale_removes_a_killed_run_and_spares_a_live_one():
    require_testbed(link=True)
    owner = _owner()
    try:
        instance, *sleepers = owner.stdout.readline().split()
    finally:
        owner.kill()  # SIGKILL: no teardown runs
        owner.wait()
        owner.stdout.close()
    assert (testbed.CPU_ROOT / instance).exists()
    assert instance in _shell("ip", "netns", "list")
    assert _alive(sleepers) == list(map(int, sleepers))
    with testbed.Testbed((0.25,), prefix=PREFIX) as live:
        removed = testbed.cleanup_stale(PREFIX)
        assert f"cgroup {testbed.CPU_ROOT / instance}" in removed
        assert_nothing_left(instance, sleepers)
        assert live.slots[0].cpu_cgroup.exists()  # its owner (this process) is alive
    assert_nothing_left(live.instance, [])


def test_pinned_slots_take_the_largest_quotas_first_each_on_the_cpu_with_most_room():
    assert testbed.pin_slots((1.0, 0.5, 0.25), 2) == [0, 1, 1]
    assert testbed.pin_slots((0.25, 1.0, 0.5), 2) == [1, 0, 1]  # by quota, not by position
    assert testbed.pin_slots((0.4,) * 4, 2) == [0, 1, 0, 1]
    assert testbed.pin_slots((1.0, 1.0, 1.0), 2) == [0, 1, 0]  # more cores than CPUs: shared
    assert testbed.pin_slots((0.5, 0.5), 1) == [0, 0]


def test_a_pinned_slots_processes_run_on_its_cpu_only():
    require_testbed()
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    with testbed.Testbed((1.0, 0.5), prefix=PREFIX, pin=True) as tb:
        assert tb.cpus == testbed.pin_slots((1.0, 0.5), os.cpu_count() or 1)
        for slot, cpu in zip(tb.slots, tb.cpus, strict=True):
            proc = tb.popen(slot, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            out, _ = proc.communicate(timeout=60)
            assert out.strip() == f"[{cpu}]", (slot.name, out)
        assert testbed.Testbed((1.0,)).cpus is None  # unpinned unless asked


def test_bad_testbed_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="below the kernel's least quota of 1 ms"):
        testbed.Testbed((0.05,), period_ms=10.0)
    with pytest.raises(ValueError, match="period_ms must be between 1 and 1000 ms"):
        testbed.Testbed(period_ms=5000)
    with pytest.raises(ValueError, match="cores must be one or more positive quotas"):
        testbed.Testbed(())
