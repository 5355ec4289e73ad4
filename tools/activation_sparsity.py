#!/usr/bin/env python3
"""How much of the shipped models' work multiplies a zero (ReLU) input, and what skipping it gives.

    python tools/activation_sparsity.py [--threads 1] [--repeat 9] [--json out.json]

For every shipped pruned MNIST model and layer, on the 1000 held-out digits:
the density of the layer's input, and the share of the multiply-adds
(weights x rows) whose input is nonzero when zeros are skipped per image,
per 32-row tile (the CUDA backend's), per 64-row tile (the CPU backend's)
and per batch. Then the time of the CPU backend's layer kernel (weight
sparsity alone) against the same kernel that first drops, per group of
tiles, the weights whose input is zero in every row of the group (weight +
activation sparsity at tile granularity; bit-identical results, checked).
Times are the minimum over --repeat runs, which is the least disturbed by
other processes on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spdnn_mpi.backends.cpu import kernels as ck  # noqa: E402
from spdnn_mpi.formats.store.reader import Store  # noqa: E402
from spdnn_mpi.generators import mnist_models as mm  # noqa: E402

T = ck.TILE_ROWS


@njit(cache=True, nogil=True, inline="always")
def _tile(src, dst, t, indptr, indices, values, bias, floor, clip, alive):
    n_out = len(indptr) - 1
    acc = np.zeros(T, dtype=np.float32)
    peak = np.zeros(T, dtype=np.float32)
    for j in range(n_out):
        for r in range(T):
            acc[r] = 0.0
        for p in range(indptr[j], indptr[j + 1]):
            i = indices[p]
            v = values[p]
            for r in range(T):
                acc[r] += v * src[t, i, r]
        b = bias[j]
        for r in range(T):
            y = min(max(acc[r] + b, floor), clip)
            dst[t, j, r] = y
            peak[r] = max(peak[r], abs(y))
    for r in range(T):
        alive[t * T + r] = peak[r] > 0


@njit(parallel=True, cache=True, nogil=True)
def layer_skip(src, dst, n_tiles, group, indptr, indices, values, bias, floor, clip, alive):
    """``cpu_kernels.layer_tiles`` after dropping, per ``group`` tiles, the weights of
    inputs that are zero in every row of the group (adding v * 0 changes no sum)."""
    n_out = len(indptr) - 1
    n_in = src.shape[1]
    for g in prange((n_tiles + group - 1) // group):
        t0, t1 = g * group, min(n_tiles, g * group + group)
        nz = np.zeros(n_in, dtype=np.int64)
        for t in range(t0, t1):
            for i in range(n_in):
                m = np.float32(0.0)
                for r in range(T):
                    m = max(m, abs(src[t, i, r]))
                if m > 0:
                    nz[i] = 1
        cptr = np.empty(n_out + 1, dtype=np.int64)
        ci = np.empty(indptr[n_out], dtype=indices.dtype)
        cv = np.empty(indptr[n_out], dtype=np.float32)
        k = 0
        cptr[0] = 0
        for j in range(n_out):
            for p in range(indptr[j], indptr[j + 1]):
                ci[k] = indices[p]
                cv[k] = values[p]
                k += nz[indices[p]]
            cptr[j + 1] = k
        for t in range(t0, t1):
            _tile(src, dst, t, cptr, ci, cv, bias, floor, clip, alive)


def active_shares(layer, x: np.ndarray) -> dict[str, float]:
    """Share of weight x row products whose input is nonzero, by skipping granularity."""
    per_input = np.bincount(layer.indices.astype(np.int64), minlength=layer.n_in)
    nz = x != 0
    out = {"input_density": float(nz.mean())}
    for name, rows in (("per_image", 1), ("per_32_rows", 32), ("per_64_rows", 64),
                       ("per_batch", len(x))):
        n = len(x) // rows * rows
        groups = nz[:n].reshape(-1, rows, layer.n_in).any(axis=1)
        out[name] = float((groups * per_input).sum(axis=1).mean() / max(per_input.sum(), 1))
    return out


def time_layers(net, x: np.ndarray, repeat: int, group: int) -> tuple[list[float], np.ndarray]:
    """Minimum seconds per layer, and the final outputs; group 0 is the shipped kernel."""
    n = len(x)
    nt = -(-n // T)
    width = max(max(lay.n_in, lay.n_out) for lay in net.layers)
    first = np.zeros((nt, width, T), np.float32)
    padded = np.zeros((nt * T, x.shape[1]), np.float32)
    padded[:n] = x
    first[:, : x.shape[1], :] = padded.reshape(nt, T, -1).transpose(0, 2, 1)
    spare = np.zeros_like(first)
    alive = np.zeros(nt * T, np.bool_)
    best = np.full(len(net.layers), np.inf)
    for _ in range(repeat + 1):  # the first run compiles
        src, dst = first.copy(), spare
        for k, lay in enumerate(net.layers):
            args = (lay.indptr, lay.indices, lay.weight_values(), lay.bias_vector(),
                    np.float32(lay.floor), np.float32(np.inf), alive)
            t0 = time.perf_counter()
            if group:
                layer_skip(src, dst, nt, group, *args)
            else:  # the shipped kernel (general values: uniform False)
                ck.layer_tiles(src, dst, nt, *args[:3], False, *args[3:])
            best[k] = min(best[k], time.perf_counter() - t0)
            src, dst = dst, src
    out = src[:, : net.layers[-1].n_out, :].transpose(0, 2, 1).reshape(-1, net.layers[-1].n_out)
    return best.tolist(), out[:n].copy()


def main(argv: list[str] | None = None) -> int:
    import numba

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")
    p.add_argument("--repeat", type=int, default=9, help="timed runs (minimum reported)")
    p.add_argument("--groups", default="1,4,16", help="tiles per skip group to time")
    p.add_argument("--cache", type=Path, default=Path("/tmp/spdnn-activation"),
                   help="where the model stores are imported")
    p.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    groups = [int(g) for g in args.groups.split(",")]
    results = []
    for entry in [e for e in mm.bundled_models() if e.get("file")]:
        with Store(mm.model_store(entry, args.cache)) as st:
            net, x = st.network(), st.inputs().to_dense()
        shares, y = [], x
        for lay in net.layers:
            shares.append(active_shares(lay, y))
            z = np.asarray(lay.to_scipy_t() @ y.T, dtype=np.float32).T + lay.bias_vector()
            y = lay.activate(np.ascontiguousarray(z, dtype=np.float32))
        base, ref = time_layers(net, x, args.repeat, 0)
        timed = {"weights only": base}
        for g in groups:
            seconds, out = time_layers(net, x, args.repeat, g)
            if not np.array_equal(out, ref):
                raise SystemExit(f"skip kernel (group {g}) differs from the shipped kernel")
            timed[f"+ skip zero inputs per {g} tile(s)"] = seconds
        results.append({"model": entry["file"], "sparsity": entry["sparsity"],
                        "layers": shares, "seconds": timed})
        print(f"\n{entry['file']} ({100 * entry['sparsity']:.0f}% zeros), threads "
              f"{numba.get_num_threads()}")
        print("  layer  input density  nonzero-input share of the multiply-adds: "
              "per image / 32 rows / 64 rows / batch")
        for k, s in enumerate(shares):
            print(f"  {k + 1:5d}  {s['input_density']:13.3f}  {s['per_image']:.3f} / "
                  f"{s['per_32_rows']:.3f} / {s['per_64_rows']:.3f} / {s['per_batch']:.3f}")
        for name, sec in timed.items():
            ms = " + ".join(f"{1e3 * v:.2f}" for v in sec)
            print(f"  {name:34s} {1e3 * sum(sec):7.2f} ms  ({ms})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
