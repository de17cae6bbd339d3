"""One rank of the PyTorch DDP peer (gloo, ``DistributedSampler``), run by ``bench_peers``.

Runs in the peers' own venv (``benchmarks.peers.install``), one process per testbed slot,
configured as ``torchrun`` would: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` in the environment, and ``GLOO_SOCKET_IFNAME`` naming the interface that
holds the rank's address (``lo`` on the loopback). The model, optimizer and data are the
benchmark's: an MLP (128, 64) with ReLU and a softmax output (cross-entropy), Adam, the
rows of the ``.npz`` the benchmark wrote. Each rank trains on its ``DistributedSampler``
share; rank 0 scores the held-out curve rows several times per epoch between two
barriers, so the time spent scoring can be left out exactly (the other ranks wait for
it), and writes a JSON of wall-clock stamps (``time.time()``, comparable with the
launcher's) to ``--out``.

Run: ``RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=lo
python ddp_train.py --data data.npz --out out.json``.
"""

from __future__ import annotations

import time

SCRIPT_START = time.time()  # before the imports: torch's import is part of the user's wait

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

PROCESS_GROUP_TIMEOUT = datetime.timedelta(seconds=300)


def build_model(n_features: int, hidden: tuple[int, ...], n_classes: int) -> nn.Module:
    """MLP with ReLU hidden layers; the softmax is in the loss (``CrossEntropyLoss``)."""
    layers: list[nn.Module] = []
    width = n_features
    for units in hidden:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


@torch.no_grad()
def accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = (model(X).argmax(dim=1) == y).sum().item()
    model.train()
    return correct / len(y)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-per-rank", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", default="128,64")
    parser.add_argument("--evals-per-epoch", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=PROCESS_GROUP_TIMEOUT)

    with np.load(args.data) as data:
        X = torch.from_numpy(np.ascontiguousarray(data["X_train"], dtype=np.float32))
        y = torch.from_numpy(data["y_train"].astype(np.int64))
        if rank == 0:
            X_curve = torch.from_numpy(np.asarray(data["X_curve"], dtype=np.float32))
            y_curve = torch.from_numpy(data["y_curve"].astype(np.int64))
            X_test = torch.from_numpy(np.asarray(data["X_test"], dtype=np.float32))
            y_test = torch.from_numpy(data["y_test"].astype(np.int64))
    n_classes = int(y.max().item()) + 1
    torch.manual_seed(args.seed)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    model = nn.parallel.DistributedDataParallel(build_model(X.shape[1], hidden, n_classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    dataset = TensorDataset(X, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    # Whole batches gathered by one index each (the sampler's batches of indices), not
    # row by row through the default collate: the tuned way to feed in-memory tensors.
    loader = DataLoader(
        dataset, sampler=BatchSampler(sampler, args.batch_per_rank, False), batch_size=None
    )
    steps_per_epoch = len(loader)
    evals = max(1, min(args.evals_per_epoch, steps_per_epoch))
    eval_steps = {round(k * steps_per_epoch / evals) for k in range(1, evals + 1)}

    ready = time.time()
    scoring_s = 0.0
    curve = []  # (wall-clock stamp, seconds spent scoring before it, accuracy, epoch)

    def evaluate(epoch: float) -> None:
        nonlocal scoring_s
        dist.barrier()
        started = time.time()
        if rank == 0:
            acc = accuracy(model.module, X_curve, y_curve)
        dist.barrier()
        if rank == 0:
            curve.append((started, scoring_s, acc, epoch))
        scoring_s += time.time() - started

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader, start=1):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            optimizer.step()
            if step in eval_steps:
                evaluate(epoch + step / steps_per_epoch)
    trained = time.time()
    if rank == 0:
        result = {
            "script_start": SCRIPT_START,
            "ready": ready,
            "trained": trained,
            "scoring_s": scoring_s,
            "curve": curve,
            "final_accuracy": accuracy(model.module, X_test, y_test),
            "steps_per_epoch": steps_per_epoch,
            "batch_per_rank": args.batch_per_rank,
            "world_size": world,
            "torch": torch.__version__,
        }
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
