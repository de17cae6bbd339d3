"""Worker pools without a batch system: job scripts, configuration, and the pool machinery.

Job scripts of every pool are generated for SLURM, PBS, SGE and LSF and compared (no
daemon is needed: nothing is submitted). The pool machinery itself (one scheduler, jobs
named by pool, ``scale_pool``) runs on ``kind="local"``, where each job is a local
process started from the job's command line.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path

import dask

# The [jobqueue] extra, which the README's test command installs: without it these tests
# fail (a skip would prove nothing).
import dask_jobqueue  # noqa: F401
import pytest

from hmdspt.parallel.client import scheduler_workers
from hmdspt.parallel.pools import (
    ClusterConfigError,
    PoolSpec,
    _merge_resources,
    add_cluster_arguments,
    client_from_args,
    cluster_config_from_dict,
    cmd_cluster_dry_run,
    load_cluster_config,
    pool_job_scripts,
    pool_of,
    start_pools,
)

pytestmark = pytest.mark.heavy(12)

# The repository's example, found from this file so the tests pass from any folder.
EXAMPLE_POOLS = Path(__file__).resolve().parents[1] / "examples" / "pools.yaml"

POOLS = [
    PoolSpec("small", count=3, cores=1, memory="2GiB", processes=1, queue="short",
             walltime="00:20:00"),
    PoolSpec("big", cores=8, memory="32GiB", processes=2, queue="fat", walltime="02:00:00",
             job_extra_directives=("--exclusive",), resources={"GPU": 1}),
]  # fmt: skip


# The local jobs' workers start without a dashboard: importing it (bokeh) costs each worker
# about a CPU-second, and no test here looks at one.
NO_DASHBOARDS = {"worker_extra_args": ["--no-dashboard"]}


def _scripts(kind: str, pools=POOLS, **common) -> dict[str, str]:
    if kind == "lsf":
        common.setdefault("lsf_units", "MB")  # else read from the machine's lsf.conf
    return pool_job_scripts(kind, pools, **common)


def _directives(script: str, prefix: str) -> list[str]:
    return [line[len(prefix) :].strip() for line in script.splitlines() if line.startswith(prefix)]


def _command(script: str) -> str:
    return next(line for line in script.splitlines() if "distributed.cli.dask_worker" in line)


# ------------------------------------------------------------------ scripts per system
def test_slurm_scripts_carry_each_pools_resources():
    scripts = _scripts("slurm", account="proj1", job_extra_directives=["--qos=normal"])
    small, big = (_directives(scripts[p], "#SBATCH") for p in ("small", "big"))
    assert {"-J dask-worker-small", "-p short", "-A proj1", "--cpus-per-task=1",
            "--mem=2G", "-t 00:20:00", "--qos=normal"} <= set(small)  # fmt: skip
    assert {"-J dask-worker-big", "-p fat", "-A proj1", "--cpus-per-task=8", "--mem=32G",
            "-t 02:00:00", "--qos=normal", "--exclusive"} <= set(big)  # fmt: skip
    assert "--exclusive" not in small
    # Common directives first, then the pool's.
    assert big.index("--qos=normal") < big.index("--exclusive")


def test_pbs_scripts_carry_each_pools_resources():
    scripts = _scripts("pbs", account="proj1")
    small, big = (_directives(scripts[p], "#PBS") for p in ("small", "big"))
    assert {"-N dask-worker-small", "-q short", "-A proj1", "-l select=1:ncpus=1:mem=2048MB",
            "-l walltime=00:20:00"} <= set(small)  # fmt: skip
    assert {"-N dask-worker-big", "-q fat", "-l select=1:ncpus=8:mem=32GB",
            "-l walltime=02:00:00", "--exclusive"} <= set(big)  # fmt: skip


def test_sge_scripts_carry_each_pools_resources():
    # SGE has no portable core or memory directive (parallel environments and memory
    # complexes are site-defined), so pools say theirs: resource_spec and "-pe".
    pools = [
        PoolSpec("small", cores=1, memory="2GiB", processes=1, queue="short.q",
                 walltime="00:20:00", options={"resource_spec": "h_vmem=2G"}),
        PoolSpec("big", cores=8, memory="32GiB", processes=2, queue="fat.q",
                 walltime="02:00:00", job_extra_directives=("-pe smp 8",),
                 options={"resource_spec": "h_vmem=4G"}),
    ]  # fmt: skip
    scripts = _scripts("sge", pools, project="proj1")
    small, big = (_directives(scripts[p], "#$") for p in ("small", "big"))
    assert {"-N dask-worker-small", "-q short.q", "-P proj1", "-l h_vmem=2G",
            "-l h_rt=00:20:00"} <= set(small)  # fmt: skip
    assert {"-N dask-worker-big", "-q fat.q", "-l h_vmem=4G", "-l h_rt=02:00:00",
            "-pe smp 8"} <= set(big)  # fmt: skip
    assert "-pe smp 8" not in small


def test_lsf_scripts_carry_each_pools_resources():
    pools = [
        PoolSpec("small", cores=1, memory="2GiB", processes=1, queue="short", walltime="00:20"),
        PoolSpec("big", cores=8, memory="32GiB", processes=2, queue="fat", walltime="02:00"),
    ]
    scripts = _scripts("lsf", pools, project="proj1")
    small, big = (_directives(scripts[p], "#BSUB") for p in ("small", "big"))
    assert {"-J dask-worker-small", "-q short", '-P "proj1"', "-n 1", "-W 00:20"} <= set(small)
    assert {"-J dask-worker-big", "-q fat", "-n 8", '-R "span[hosts=1]"', "-W 02:00"} <= set(big)
    mem = {p: int(next(d for d in dirs if d.startswith("-M "))[3:])
           for p, dirs in (("small", small), ("big", big))}  # fmt: skip
    assert mem == {"small": 2148, "big": 34360}  # MB, rounded up


@pytest.mark.parametrize("kind", ["slurm", "pbs", "sge", "lsf"])
def test_worker_command_names_the_pool_and_splits_the_job(kind):
    scripts = _scripts(kind, interface="ib0")
    small, big = _command(scripts["small"]), _command(scripts["big"])
    assert "--name small-0 " in small and "--name big-0 " in big
    assert "--resources pool-small=1" in small
    assert "--resources pool-big=1,GPU=1" in big
    assert "--nthreads 1 " in small and "--memory-limit 2.00GiB" in small
    # 8 cores and 32 GiB in 2 processes: 4 threads and 16 GiB each.
    assert "--nthreads 4 " in big and "--memory-limit 16.00GiB" in big and "--nworkers 2" in big
    assert "--interface ib0" in small and "<scheduler-address>" in small
    # One BLAS thread per worker thread unless the pool says otherwise.
    assert "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1" in scripts["big"]


def test_blas_threads_auto_and_none():
    auto = PoolSpec("p", cores=8, memory="8GiB", processes=2, blas_threads="auto")
    none = PoolSpec("q", cores=8, memory="8GiB", processes=2, blas_threads=None)
    scripts = _scripts("slurm", [auto, none])
    assert "OMP_NUM_THREADS=4 " in scripts["p"]
    assert "OMP_NUM_THREADS" not in scripts["q"]


def test_lists_add_up_and_the_pool_wins_on_scalars():
    pool = PoolSpec(
        "p",
        cores=2,
        memory="4GiB",
        processes=1,
        walltime="00:05:00",
        options={
            "worker_extra_args": ["--lifetime", "4m"],
            "job_script_prologue": ["module load python"],
            "job_name": "mine",
        },
    )
    script = _scripts(
        "slurm",
        [pool],
        walltime="01:00:00",
        worker_extra_args=["--resources", "ssd=1"],
        job_script_prologue=["source env.sh"],
    )["p"]
    assert "#SBATCH -t 00:05:00" in script and "01:00:00" not in script
    assert "#SBATCH -J mine" in script
    lines = script.splitlines()
    assert lines.index("source env.sh") < lines.index("module load python")
    command = _command(script)
    assert "--lifetime 4m" in command
    assert command.count("--resources") == 1 and "--resources ssd=1,pool-p=1" in command


def test_unset_settings_come_from_dask_jobqueue_config():
    config = {
        "jobqueue.pbs.cores": 4,
        "jobqueue.pbs.memory": "16GB",
        "jobqueue.pbs.queue": "regular",
        "jobqueue.pbs.walltime": "00:45:00",
        "jobqueue.pbs.name": "hm",
        "jobqueue.pbs.job-extra-directives": ["-m n"],
    }
    with dask.config.set(config):
        scripts = _scripts(
            "pbs",
            [
                PoolSpec("plain", processes=1),
                PoolSpec("own", cores=2, memory="4GB", processes=1, queue="debug",
                         job_extra_directives=("-V",)),
            ],
        )  # fmt: skip
    plain, own = _directives(scripts["plain"], "#PBS"), _directives(scripts["own"], "#PBS")
    assert {"-N hm-plain", "-q regular", "-l select=1:ncpus=4:mem=15GB",
            "-l walltime=00:45:00", "-m n"} <= set(plain)  # fmt: skip
    assert {"-N hm-own", "-q debug", "-l select=1:ncpus=2:mem=3815MB", "-m n", "-V"} <= set(own)


def test_a_pool_takes_its_settings_from_its_own_jobqueue_section():
    """``config_name``: the pool's section first, then the common keywords (dask-jobqueue's
    ``config_name=`` per pool)."""
    section = {"cores": 8, "memory": "64GiB", "queue": "fat", "walltime": "04:00:00",
               "job-extra-directives": ["--constraint=bigmem"], "name": "hm"}  # fmt: skip
    with dask.config.set({"jobqueue.bigmem": section}):
        pools = [
            PoolSpec("fat", processes=1, config_name="bigmem"),
            PoolSpec("fatter", cores=16, processes=1, config_name="bigmem"),
            PoolSpec("plain", cores=1, memory="2GiB", processes=1),
        ]
        scripts = _scripts("slurm", pools, queue="normal", walltime="00:10:00")
        fat, fatter, plain = (_directives(scripts[p], "#SBATCH") for p in scripts)
        assert {"-J hm-fat", "-p fat", "--cpus-per-task=8", "--mem=64G", "-t 04:00:00",
                "--constraint=bigmem"} <= set(fat)  # fmt: skip
        assert {"-p fat", "--cpus-per-task=16", "--mem=64G"} <= set(fatter)  # the pool wins
        assert {"-p normal", "-t 00:10:00"} <= set(plain) and "--constraint=bigmem" not in plain
        assert PoolSpec.from_dict({"config-name": "bigmem"}, name="a").config_name == "bigmem"
        assert "config jobqueue.bigmem" in pools[0].describe()
    with pytest.raises(ClusterConfigError, match="no section jobqueue.nope"):
        PoolSpec("p", config_name="nope")


def test_pools_without_cores_or_memory_anywhere_are_refused():
    with pytest.raises(ClusterConfigError, match="cores and memory must be set"):
        _scripts("slurm", [PoolSpec("p")])


def test_unknown_pool_options_and_common_settings_are_refused():
    with pytest.raises(ClusterConfigError, match="pool 'p': unknown option wallclock"):
        _scripts("slurm", [PoolSpec("p", cores=1, memory="1GiB", options={"wallclock": "1"})])
    with pytest.raises(ClusterConfigError, match="unknown setting"):
        _scripts("slurm", POOLS, queue_name="x")
    # A keyword of another system's jobs is unknown too.
    with pytest.raises(ClusterConfigError, match="resource_spec"):
        _scripts("slurm", [PoolSpec("p", cores=1, memory="1GiB",
                                    options={"resource_spec": "x"})])  # fmt: skip


def test_merge_resources_keeps_one_argument():
    assert _merge_resources(["--lifetime", "1m"], {"pool-a": 1}) == [
        "--lifetime", "1m", "--resources", "pool-a=1"]  # fmt: skip
    assert _merge_resources(["--resources=GPU=2 ssd=1"], {"pool-a": 1}) == [
        "--resources", "GPU=2,ssd=1,pool-a=1"]  # fmt: skip


# ---------------------------------------------------------------- PoolSpec validation
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="bad-name"), "pool name"),
        (dict(name="1st"), "pool name"),
        (dict(name="p", count=-1), "count"),
        (dict(name="p", cores=0), "cores"),
        (dict(name="p", cores=2, processes=3), "processes"),
        (dict(name="p", memory="lots"), "memory"),
        (dict(name="p", resources={"GPU": -1}), "resource"),
        (dict(name="p", resources={"a=b": 1}), "resource name"),
        (dict(name="p", blas_threads=0), "blas_threads"),
        (dict(name="p", options={"cores": 2}), "cannot be set in options"),
        (dict(name="p", options={"scheduler": "x"}), "cannot be set in options"),
    ],
)
def test_poolspec_rejects_bad_settings(kwargs, match):
    with pytest.raises(ClusterConfigError, match=match):
        PoolSpec(**kwargs)


def test_pool_of_worker_and_job_names():
    assert pool_of("big-0") == pool_of("big-12-1") == "big"
    assert pool_of("small_mem-3") == "small_mem"


def test_duplicate_pool_names_are_refused():
    with pytest.raises(ClusterConfigError, match="unique"):
        _scripts("slurm", [POOLS[0], POOLS[0]])


# ---------------------------------------------------------------------- pools files
def test_example_pools_file_parses_and_prints(capsys):
    config = load_cluster_config(EXAMPLE_POOLS)
    assert config.kind == "slurm"
    assert [p.name for p in config.pools] == ["small", "big"]
    assert config.common["interface"] == "lo" and config.common["death_timeout"] == 60
    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    args = parser.parse_args(["--cluster-config", str(EXAMPLE_POOLS)])
    assert cmd_cluster_dry_run(args) == 0
    out = capsys.readouterr().out
    assert "# ---- pool small: 1 job x 1 core, 1.00 GiB" in out
    assert "#SBATCH --cpus-per-task=2" in out and "--name big-0" in out


def test_pools_file_forms_and_kebab_case(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(
        textwrap.dedent(
            """
            cluster: pbs
            wait-timeout: 30
            common: {walltime: "00:10:00", job-extra-directives: ["-m n"]}
            pools:
              - {name: a, cores: 2, memory: 4GiB, job-extra-directives: ["-V"],
                 resource-spec: "select=1:ncpus=2:mem=4gb", blas-threads: auto}
              - {name: b, cores: 1, memory: 1GiB, count: 0}
            """
        )
    )
    config = load_cluster_config(path)
    assert config.kind == "pbs" and config.wait_timeout == 30
    a, b = config.pools
    assert a.job_extra_directives == ("-V",) and a.blas_threads == "auto"
    assert a.options == {"resource_spec": "select=1:ncpus=2:mem=4gb"}
    assert b.count == 0
    script = pool_job_scripts(config.kind, config.pools, **config.common)["a"]
    assert "#PBS -l select=1:ncpus=2:mem=4gb" in script and "#PBS -m n\n#PBS -V" in script


@pytest.mark.parametrize(
    "data, kind, match",
    [
        ({"cluster": "slurm", "pools": {"a": {"cores": 1}}}, "pbs", "disagrees"),
        ({"pools": {"a": {}}}, None, "which batch system"),
        ({"cluster": "condor", "pools": {"a": {}}}, None, "cluster kind"),
        ({"cluster": "slurm"}, None, "needs pools"),
        ({"cluster": "slurm", "pools": {}}, None, "no pool"),
        ({"cluster": "slurm", "pools": {"a": {}}, "extra": 1}, None, "unknown key"),
        ({"cluster": "slurm", "pools": {"a": {}}, "wait-timeout": -1}, None, "wait-timeout"),
        ({"cluster": "slurm", "pools": [{"cores": 1}]}, None, "needs a name"),
        ({"cluster": "slurm", "pools": {"a": {"name": "b"}}}, None, "different name"),
        ({"cluster": "slurm", "pools": {"a": {}}, "common": [1]}, None, "common"),
    ],
)
def test_bad_pools_files_are_refused(data, kind, match):
    with pytest.raises(ClusterConfigError, match=match):
        cluster_config_from_dict(data, kind)


def test_missing_and_unparsable_pools_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="pools file not found"):
        load_cluster_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(ClusterConfigError, match="cannot parse"):
        load_cluster_config(bad)


def test_no_pools_file_means_emulated_local_or_a_default_pool():
    assert load_cluster_config(None, None).pools == []
    assert load_cluster_config(None, "local").pools == []
    config = load_cluster_config(None, "sge")
    assert config.kind == "sge" and [(p.name, p.count) for p in config.pools] == [("default", 2)]


def test_dry_run_without_pools_says_emulated(capsys):
    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    assert cmd_cluster_dry_run(parser.parse_args(["--cluster", "local"])) == 0
    assert "emulated" in capsys.readouterr().out


def test_scheduler_and_cluster_together_are_refused():
    args = argparse.Namespace(scheduler="tcp://x:1", cluster="slurm", cluster_config=None)
    with pytest.raises(ClusterConfigError, match="either --scheduler"):
        client_from_args(args)


def test_cluster_argument_choices():
    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cluster", "condor"])
    args = parser.parse_args(["--cluster", "pbs", "--cluster-config", "f.yaml"])
    assert (args.cluster, args.cluster_config) == ("pbs", "f.yaml")


# ------------------------------------------------- the pool machinery on local "jobs"
@pytest.fixture
def jobs_tmp(tmp_path, monkeypatch):
    """The local "jobs" write their temporary files into the test's folder: a job that is
    cancelled is SIGKILLed, as a batch system would, and its nanny's multiprocessing
    folder (a forkserver socket) would be left in the machine's temporary folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("jobs_tmp")
def test_local_pools_share_one_scheduler_and_scale_per_pool():
    from distributed import Client

    pools = [
        # One process a job, without a nanny: a nanny starts a second process per job,
        # doubling its start-up, and the pools are what is tested here.
        PoolSpec("small", cores=1, memory="512MiB", processes=1, resources={"ssd": 1},
                 options={"nanny": False}),
        PoolSpec("big", cores=2, memory="1GiB", processes=2),
    ]  # fmt: skip
    with start_pools("local", pools, timeout=60, interface="lo", **NO_DASHBOARDS) as cluster:
        with Client(cluster) as client:
            assert cluster.last_scale_s is not None and cluster.last_scale_s < 60
            workers = scheduler_workers(client).values()
            by_name = {w["name"]: w for w in workers}
            assert sorted(by_name) == ["big-0-0", "big-0-1", "small-0"]
            assert by_name["small-0"]["resources"] == {"pool-small": 1, "ssd": 1}
            assert by_name["big-0-1"]["resources"] == {"pool-big": 1}
            assert all(w["nthreads"] == 1 for w in workers)
            assert cluster.workers_by_pool() == {"small": ["small-0"],
                                                 "big": ["big-0-0", "big-0-1"]}  # fmt: skip
            # Tasks can be pinned to a pool through its resource.
            future = client.submit(lambda: 1, resources={"pool-small": 1}, pure=False)
            assert future.result() == 1
            assert client.who_has(future)[future.key] == (
                next(a for a, w in scheduler_workers(client).items()
                     if w["name"] == "small-0"),
            )  # fmt: skip
            assert "--name small-0" in cluster.job_script("small")
            assert set(cluster.job_scripts()) == {"small", "big"}

            cluster.scale_pool("small", 0)
            _wait_until(lambda: cluster.workers_by_pool()["small"] == [])
            assert cluster.pools["small"].count == 0
            cluster.scale_pool("small", 2)  # names are never reused
            cluster.wait_for_pools(timeout=60)
            assert cluster.workers_by_pool()["small"] == ["small-1", "small-2"]
            assert cluster.pools["small"].count == 2

            cluster.scale(jobs=1, pool="small")  # dask-jobqueue's scale, per pool
            _wait_until(lambda: cluster.workers_by_pool()["small"] == ["small-1"])
            assert cluster.pools["small"].count == 1
            cluster.scale(4, pool="big")  # workers: 2 jobs of 2 processes
            assert cluster.pools["big"].count == 2
            cluster.scale(cores=2, pool="big")  # 1 job of 2 cores
            assert cluster.pools["big"].count == 1
            with pytest.raises(ClusterConfigError, match="name it, scale"):
                cluster.scale(4)
            with pytest.raises(ClusterConfigError, match="no pool 'nope'"):
                cluster.scale(jobs=1, pool="nope")
            with pytest.raises(ClusterConfigError, match="adapts per pool"):
                cluster.adapt(minimum=1, maximum=4)
            with pytest.raises(ClusterConfigError, match=r"minimum \(4\) > maximum \(2\)"):
                cluster.adapt(pool="big", minimum_jobs=2, maximum_jobs=1)
            with pytest.raises(ClusterConfigError, match="no pool"):
                cluster.scale_pool("nope", 1)
            with pytest.raises(ClusterConfigError, match="already exists"):
                cluster.add_pool(pools[0])
            assert "small: 1 job x 1 core" in repr(cluster)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("jobs_tmp")
def test_a_pool_adapts_to_the_load_between_its_own_bounds():
    """adapt(pool=, minimum_jobs=, maximum_jobs=): up to the maximum under load, back to
    the minimum after; the other pool is left alone."""
    import time

    from distributed import Client

    pools = [PoolSpec("small", count=0, cores=1, memory="512MiB", processes=1),
             PoolSpec("big", cores=1, memory="512MiB", processes=1)]  # fmt: skip
    with start_pools(
        "local", pools, timeout=60, interface="lo", nanny=False, **NO_DASHBOARDS
    ) as cluster:
        with Client(cluster) as client:
            adaptive = cluster.adapt(
                pool="small", minimum_jobs=1, maximum_jobs=2, interval="100ms", wait_count=2,
                target_duration="1s",
            )  # fmt: skip
            _wait_until(lambda: cluster.workers_by_pool()["small"] == ["small-0"])
            # Load that lasts until the test lifts it (cancels it), however slowly a job
            # starts.
            futures = client.map(time.sleep, [60.0] * 16, pure=False)
            _wait_until(lambda: len(cluster.workers_by_pool()["small"]) == 2, timeout=60)
            time.sleep(1.0)  # a few more adaptive intervals under the same load
            assert len(cluster.workers_by_pool()["small"]) == 2  # never past maximum_jobs
            client.cancel(futures)
            del futures
            # Scaling down retires the worker first and then drops its job from the plan.
            _wait_until(
                lambda: (
                    cluster.workers_by_pool()["small"] == ["small-0"]
                    and cluster.pools["small"].count == 1
                )
            )
            assert cluster.pools["small"].count == 1 and cluster.pools["big"].count == 1
            assert cluster.workers_by_pool()["big"] == ["big-0"]
            adaptive.stop()


@pytest.mark.usefixtures("jobs_tmp")
def test_pools_timeout_names_the_missing_workers():
    from hmdspt.parallel.pools import PoolsTimeoutError

    with start_pools("local", [PoolSpec("p", cores=1, memory="512MiB", processes=1)],
                     interface="lo", nanny=False, **NO_DASHBOARDS) as cluster:  # fmt: skip
        # A planned job that was never submitted stands for one stuck in the queue.
        cluster._jobs["p"].append("p-99")
        try:
            with pytest.raises(PoolsTimeoutError, match=r"1 worker\(s\) .*: p-99 \(job \?\)"):
                cluster.wait_for_pools(timeout=0.5)
        finally:
            cluster._jobs["p"].remove("p-99")


def _wait_until(condition, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


@pytest.mark.usefixtures("jobs_tmp")
def test_local_pools_file_through_client_from_args(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(
        textwrap.dedent(
            """
            cluster: local
            wait-timeout: 60
            common: {interface: lo, nanny: false, worker-extra-args: [--no-dashboard]}
            pools:
              one: {cores: 1, memory: 512MiB, processes: 1}
              two: {cores: 1, memory: 512MiB, processes: 1}
            """
        )
    )
    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    args = parser.parse_args(["--cluster-config", str(path)])
    stack, client, label = client_from_args(args)
    with stack:
        names = sorted(w["name"] for w in scheduler_workers(client).values())
        assert names == ["one-0", "two-0"]
    assert re.match(r"local pools: one: .*; two: .*; 2 workers connected in [\d.]+ s", label)


def test_the_pools_leave_sigint_as_they_found_it():
    """dask_jobqueue.runner sets SIGINT to sys.exit() when imported: Ctrl-C would end a fit
    as a clean exit. The pools put Python's handler back (a fresh process, as a user's)."""
    import subprocess
    import sys

    code = (
        "import signal; from hmdspt.parallel.pools import pooled_cluster_class; "
        "pooled_cluster_class('slurm'); "
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.split() == ["True"], result.stderr
