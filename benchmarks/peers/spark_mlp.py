"""The Spark MLlib peer: ``MultilayerPerceptronClassifier`` on a standalone cluster.

Run by ``bench_peers`` in the peers' own venv, on the driver side of the testbed, against
a standalone master whose workers run in the testbed's groups. Reads the benchmark's rows
from Parquet (written from the same arrays as the ``.npz`` the other peers read), caches
them on the executors, then fits once per ``--max-iters`` value, each fit from scratch,
and scores each fitted model on the held-out curve rows and the test rows. Spark MLP has
sigmoid hidden layers and a softmax output, and the solvers ``l-bfgs`` and ``gd``
(full-batch gradient descent); nothing else is configurable. Writes a JSON of wall-clock
stamps (``time.time()``) to ``--out``.
"""

from __future__ import annotations

import time

SCRIPT_START = time.time()  # the JVM's start-up is part of the user's wait

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from pyspark.ml.classification import MultilayerPerceptronClassifier  # noqa: E402
from pyspark.ml.evaluation import MulticlassClassificationEvaluator  # noqa: E402
from pyspark.ml.feature import VectorAssembler  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402


def session(args: argparse.Namespace) -> SparkSession:
    builder = (
        SparkSession.builder.master(args.master)
        .appName("hmdspt-peers-mlp")
        .config("spark.driver.host", args.driver_host)
        .config("spark.driver.bindAddress", args.driver_host)
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.executor.memory", args.executor_memory)
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(args.executors))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", args.local_dir)
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        # Start the first job only once every executor has registered.
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
        .config("spark.executorEnv.OPENBLAS_NUM_THREADS", "1")
        .config("spark.executorEnv.OMP_NUM_THREADS", "1")
        .config("spark.driver.extraJavaOptions", args.java_options)
        .config("spark.executor.extraJavaOptions", args.java_options)
    )
    return builder.getOrCreate()


def _fit_schedule(spark_args: argparse.Namespace, solver: str, train, layers, score, echo):
    """Fits from scratch at each maxIter of ``solver``'s schedule; skips past the budget."""
    iters = spark_args.lbfgs_iters if solver == "l-bfgs" else spark_args.gd_iters
    step = spark_args.gd_step if solver == "gd" else 0.03  # stepSize is used by gd only
    fits, skipped = [], []
    fitting_s = 0.0
    for max_iter in (int(m) for m in iters.split(",")):
        if fits and spark_args.budget_s is not None:
            # Fit time grows about linearly with maxIter.
            expected = fits[-1]["fit_s"] * max_iter / fits[-1]["max_iter"]
            if fitting_s + expected > spark_args.budget_s:
                skipped.append(max_iter)
                continue
        mlp = MultilayerPerceptronClassifier(
            layers=layers,
            solver=solver,
            maxIter=max_iter,
            stepSize=step,
            blockSize=spark_args.block_size,
            seed=spark_args.seed,
        )
        started = time.time()
        model = mlp.fit(train)
        fit_s = time.time() - started
        fitting_s += fit_s
        scored = time.time()
        curve_accuracy, test_accuracy = score(model)
        echo(f"{solver} maxIter {max_iter}: fit {fit_s:.1f} s, test accuracy {test_accuracy:.4f}")
        fits.append(
            {
                "max_iter": max_iter,
                "iterations": len(model.summary().objectiveHistory),
                "fit_s": fit_s,
                "score_s": time.time() - scored,
                "curve_accuracy": curve_accuracy,
                "test_accuracy": test_accuracy,
            }
        )
    return {"solver": solver, "step_size": step, "fits": fits, "skipped": skipped}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--driver-host", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--curve", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--features", type=int, required=True)
    parser.add_argument("--classes", type=int, required=True)
    parser.add_argument("--solvers", default="l-bfgs,gd")
    parser.add_argument("--lbfgs-iters", default="5,10,20", help="maxIter values of l-bfgs")
    parser.add_argument("--gd-iters", default="5,10,20", help="maxIter values of gd")
    parser.add_argument("--gd-step", type=float, default=0.03, help="gd's stepSize")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="per solver: skip a maxIter whose fit would end past this many seconds of fitting",
    )
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--hidden", default="128,64")
    parser.add_argument("--executors", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--executor-memory", default="1g")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--java-options", default="", help="for the driver's and executors' JVMs")
    args = parser.parse_args()

    def echo(message: str) -> None:
        print(f"[{time.time() - SCRIPT_START:7.1f} s] {message}", flush=True)

    spark = session(args)
    spark.sparkContext.setLogLevel("WARN")
    echo("session up, every executor registered")

    def load(path: str):
        frame = spark.read.parquet(path)
        features = [c for c in frame.columns if c != "label"]
        assembled = VectorAssembler(inputCols=features, outputCol="features").transform(frame)
        return assembled.select("features", "label").repartition(args.partitions).cache()

    train = load(args.train)
    n_rows = train.count()
    loaded = time.time()
    echo(f"{n_rows} training rows cached in {args.partitions} partitions")
    layers = [args.features, *(int(h) for h in args.hidden.split(",")), args.classes]
    # A maxIter=1 fit first: class loading and JIT compilation land in the start-up (as a
    # user's single fit would pay them), not in the first timed fit.
    MultilayerPerceptronClassifier(layers=layers, maxIter=1, seed=args.seed).fit(train)
    warmed = time.time()
    echo("warm-up fit done")

    # The held-out rows are read when first scored: scoring is not training.
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    held_out = {}

    def score(model) -> tuple[float, float]:
        if not held_out:
            held_out.update(curve=load(args.curve), test=load(args.test))
        return tuple(evaluator.evaluate(model.transform(held_out[k])) for k in ("curve", "test"))

    solvers = [
        _fit_schedule(args, solver, train, layers, score, echo)
        for solver in args.solvers.split(",")
    ]
    result = {
        "script_start": SCRIPT_START,
        "loaded": loaded,
        "warmed": warmed,
        "n_rows": n_rows,
        "layers": layers,
        "partitions": args.partitions,
        "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1,
        "spark": spark.version,
        "blas": spark.sparkContext._jvm.dev.ludovic.netlib.blas.BLAS.getInstance()
        .getClass()
        .getSimpleName(),
        "solvers": solvers,
    }
    spark.stop()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
