"""Is SNICIT's centroid + sparse residual update bit-exact in float32? (a measurement)

After a threshold layer T, each row y is kept as a centroid c[a] plus a
residual d = y - c[a]; a layer is then computed as relu(W^T c + W^T d + b)
(clipped), which equals relu(W^T y + b) in real arithmetic. This script
compares it with the plain float32 layer, row by row, on the real 1024
network (MNIST-derived inputs) and on random networks without a clip, and
prints how many rows differ in any value and how many categories flip.

    python tools/residual_experiment.py [--images 3000]

Measured 2026-12-03 (docs/performance.md, "Centroid + residual"): features
differ in up to 203 of 3000 rows of the real network and in 73-83 % of the
rows of random networks; no category flipped in these runs, but nothing
bounds it, so the engine keeps exact duplicates only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _layer(wt, bias, clip, y):
    z = np.asarray(wt @ y.T, dtype=np.float32).T + bias[None, :]
    np.maximum(z, 0, out=z)
    if clip is not None:
        np.minimum(z, np.float32(clip), out=z)
    return z.astype(np.float32)


def compare(network, rows, threshold: int, n_centroids: int, rng) -> dict:
    """Rows whose features differ (worst layer), category flips, residual density."""
    mats = [(lay.to_scipy_t(), lay.bias_vector(), lay.clip) for lay in network.layers]
    y = rows.to_dense()
    for k in range(threshold):
        y = _layer(*mats[k], y)
    cent = y[rng.choice(len(y), n_centroids, replace=False)]
    assign = np.argmin(np.abs(y[:, None, :] - cent[None]).sum(axis=2), axis=1)
    resid, direct = y - cent[assign], y.copy()
    worst = flips = 0
    density = []
    for wt, bias, clip in mats[threshold:]:
        direct = _layer(wt, bias, clip, direct)
        z = (np.asarray(wt @ cent.T, np.float32).T[assign]
             + np.asarray(wt @ resid.T, np.float32).T + bias[None, :])
        np.maximum(z, 0, out=z)
        if clip is not None:
            np.minimum(z, np.float32(clip), out=z)
        cent = _layer(wt, bias, clip, cent)
        resid = z - cent[assign]
        worst = max(worst, int(np.count_nonzero((direct != z).any(axis=1))))
        flips += int(np.count_nonzero(direct.any(axis=1) != z.any(axis=1)))
        density.append(np.count_nonzero(resid) / resid.size)
    return {"rows": len(y), "rows_differ_worst_layer": worst, "category_flips": flips,
            "residual_density_mean": round(float(np.mean(density)), 4)}


def main() -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import challenge_dir, random_inputs, random_network

    from spdnn_mpi.formats.tsv.tree import iter_layers
    from spdnn_mpi.generators.digits import digit_images
    from spdnn_mpi.model import Network

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3000, help="inputs of the real network")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    folder = challenge_dir() / "neuron1024"
    if folder.is_dir():
        net = Network(list(iter_layers(folder, 1024, 30, bias=-0.3, clip=32.0)))
        rows = digit_images(1024, args.images)
        for threshold in (6, 10):
            print(f"real 1024, layers {threshold + 1}-30, 16 centroids:",
                  compare(net, rows, threshold, 16, rng), flush=True)
    for seed in range(4):
        r = np.random.default_rng(seed)
        net = random_network(r, [256] * 16, 0.08, bias="vector", clip=None)
        for lay in net.layers:  # values of order one through 16 layers
            lay.values = (lay.values / np.float32(np.abs(lay.values).sum() / 256))
        rows = random_inputs(r, 1000, 256, 0.2, binary=False)
        print(f"random 256 x 16, seed {seed}, 8 centroids:", compare(net, rows, 3, 8, r),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
