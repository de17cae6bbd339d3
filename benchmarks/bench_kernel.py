"""Full-epoch training throughput of BPNNClassifier against scikit-learn's MLPClassifier.

make_classification(200_000 x 100, 60 informative, 10 classes), hidden (128, 64), batch 256,
Adam, one BLAS thread. The three fits run interleaved, ``--repeats`` times, and the ratios
of the medians are printed and charted in ``benchmarks/out/kernel.png``.
Run: ``python -m benchmarks.bench_kernel``.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_limits

from hmdspt.estimator import BPNNClassifier

from ._common import header, timed
from .report import OUT, pyplot, save_figure, shown


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT, help="where kernel.png goes")
    args = parser.parse_args(argv)

    warnings.simplefilter("ignore", ConvergenceWarning)
    X, y = make_classification(
        n_samples=args.rows, n_features=100, n_informative=60, n_classes=10, random_state=0
    )
    X32 = X.astype(np.float32)
    common = dict(
        hidden_layer_sizes=(128, 64),
        batch_size=256,
        solver="adam",
        max_iter=1,
        shuffle=True,
        random_state=0,
    )
    fits = {
        "BPNNClassifier float32": lambda: BPNNClassifier(**common).fit(X32, y),
        "MLPClassifier float64": lambda: MLPClassifier(**common).fit(X, y),
        "MLPClassifier float32": lambda: MLPClassifier(**common).fit(X32, y),
    }
    times: dict[str, list[float]] = {name: [] for name in fits}
    with threadpool_limits(1):
        header("kernel: one-epoch throughput, 1 BLAS thread")
        for _ in range(args.repeats):
            for name, fit in fits.items():  # interleaved: noise hits all three alike
                times[name].append(timed(fit)[0])
    median = {name: float(np.median(t)) for name, t in times.items()}
    for name, t in median.items():
        print(
            f"{name:24s} epoch {t:6.2f} s  {args.rows / t:10,.0f} samples/s  (runs: "
            + ", ".join(f"{v:.2f}" for v in times[name])
            + ")"
        )
    ours = median["BPNNClassifier float32"]
    ratios = {
        "vs MLPClassifier float64": median["MLPClassifier float64"] / ours,
        "vs MLPClassifier float32": median["MLPClassifier float32"] / ours,
    }
    for name, r in ratios.items():
        print(f"throughput ratio BPNNClassifier {name}: {r:.2f}x")
    print(f"chart: {shown(plot(times, args.rows, args.out / 'kernel.png'))}")
    return ratios


def plot(times: dict[str, list[float]], rows: int, path: Path) -> Path:
    """Samples per second of one epoch per fit: median as a bar, each run as a dot."""
    plt = pyplot()
    names = list(times)
    fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    y = np.arange(len(names))
    medians = [rows / float(np.median(times[n])) for n in names]
    bars = ax.barh(y, medians, color=["C0"] + ["C7"] * (len(names) - 1), alpha=0.8)
    ax.bar_label(bars, labels=[f"{m:,.0f} /s" for m in medians], label_type="center", color="white")
    for i, n in enumerate(names):
        ax.plot([rows / t for t in times[n]], [i] * len(times[n]), "k.", ms=6)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.1 * max(max(rows / t for t in ts) for ts in times.values()))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    ax.set_xlabel("training samples per second, one epoch (bar: median, dots: runs)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(
        "One-epoch training throughput, one process, 1 BLAS thread\n"
        f"{rows:,} x 100 features, MLP 100-128-64-10, batch 256, Adam",
        fontsize=10,
    )
    return save_figure(fig, path)


if __name__ == "__main__":
    main()
