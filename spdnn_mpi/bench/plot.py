"""``spdnn bench --plot FILE.png`` for configurations: (a) TE/s per configuration against
the published anchors, (b) time and live rows per layer of ``--plot-config``."""

from __future__ import annotations

from pathlib import Path

from spdnn_mpi.errors import SpdnnError

INSTALL_HINT = "--plot needs matplotlib: pip install 'spdnn_mpi[bench]'"


def pyplot():
    """matplotlib.pyplot on the Agg backend, or a one-line SpdnnError saying how to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpdnnError(INSTALL_HINT) from None
    return plt


def _name(config: tuple[int, int]) -> str:
    return f"{config[0]}x{config[1]}"


def store_config(path: Path, layers: int | None) -> tuple[int, int]:
    """(N, L) a store case will run, from the store's attributes (no weights read)."""
    from spdnn_mpi.formats.store.reader import Store

    with Store(path) as store:
        shapes = store.layer_shapes()
        return shapes[0][0], store.n_layers if layers is None else layers


def check_options(args, store_cases: list[tuple[Path, int | None]],
                  configs: list[tuple[int, int]], has_models: bool) -> None:
    """Refuse --plot/--plot-config combinations that cannot work, before the run
    (``store_cases`` and ``configs``: what will run)."""
    if not (args.plot or args.plot_config):
        return
    planned = [store_config(p, lay) for p, lay in store_cases] + list(configs)
    if args.plot_config and not args.plot:
        raise SpdnnError("--plot-config needs --plot FILE.png")
    if args.plot_config and tuple(args.plot_config) not in planned:
        have = ", ".join(sorted({_name(c) for c in planned})) or "none"
        raise SpdnnError(f"--plot-config {_name(args.plot_config)} is not a configuration "
                         f"of this run (configurations: {have})")
    if not args.plot or not planned:
        return
    if has_models:
        raise SpdnnError("--plot draws either models or configurations: run --models and "
                         "the configurations in separate calls")
    pyplot()  # matplotlib missing: say so now, not after the run


def chosen_row(results: list[dict], config: tuple[int, int] | None) -> dict:
    """The result of ``config``; by default the largest N x L that ran (then the widest)."""
    if config is not None:
        for r in results:
            if (r["neurons"], r["layers"]) == tuple(config):
                return r
        raise SpdnnError(f"--plot-config {_name(config)} did not run")
    return max(results, key=lambda r: (r["neurons"] * r["layers"], r["neurons"]))


def _rates_panel(ax, results: list[dict]) -> None:
    """(a) TE/s per configuration: both our modes and the two published anchors."""
    by_config = {(r["neurons"], r["layers"]): r for r in results}
    configs = sorted(by_config)
    x = list(range(len(configs)))
    series = [
        ("spdnn off / direct (every live row)", "o", "-",
         lambda r: r["modes"].get("off", {}).get("teraedges_per_second")),
        ("spdnn auto / compressed, nominal", "s", "-",
         lambda r: r["modes"].get("auto", {}).get("teraedges_per_second")),
        ("2020 paper, one A100 (every live row)", "x", "--",
         lambda r: r.get("anchors", {}).get("paper_2020_a100")),
        ("SNICIT, one RTX A6000 (compressed, nominal)", "^", "--",
         lambda r: r.get("anchors", {}).get("snicit_a6000")),
    ]
    for label, marker, style, get in series:
        pts = [(xi, get(by_config[c])) for xi, c in zip(x, configs)]
        pts = [(xi, v) for xi, v in pts if v]
        if pts:
            ax.plot(*zip(*pts), marker=marker, linestyle=style, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels([_name(c) for c in configs], rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("TeraEdges/s (images x edges / time)")
    backend = results[0]["backend"] if results else ""
    gpu = any("anchors" in r for r in results)
    none = not any(v for r in results for v in r.get("anchors", {}).values())
    note = ("" if not none else "\n(no published anchors for these configurations)" if gpu
            else "\n(published anchors are GPU figures: drawn for GPU runs only)")
    ax.set_title(f"(a) TE/s per configuration N x L, spdnn backend {backend}" + note)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=2)


def _layers_panel(ax, row: dict) -> None:
    """(b) one configuration: time per layer (both modes) and live rows on a second axis."""
    modes = row["modes"]
    timed = {m: v for m, v in modes.items() if v.get("layer_seconds") is not None}
    labels = {"off": "off / direct", "auto": "auto / compressed"}
    name = f"{row['neurons']}x{row['layers']}"
    rows_ax = ax
    if timed:
        for mode, v in timed.items():
            us = [1e6 * s for s in v["layer_seconds"]]
            ax.plot(range(1, len(us) + 1), us, label=f"time per layer, {labels[mode]}")
        first = row.get("first_layers", {})
        floor = first.get("floor_us_per_layer")
        if floor:  # only for a card of floors.CARDS, the one this run used
            ax.plot(range(1, len(floor) + 1), floor, linestyle=":",
                    label=f"{first['card']} floor, off (HBM / FMA model)")
        ax.set_yscale("log")
        ax.set_ylabel("microseconds per layer")
        rows_ax = ax.twinx()
        ax.set_title(f"(b) {name}: time and live rows per layer")
    else:
        ax.set_title(f"(b) {name}: live rows per layer only (backend {row['backend']} "
                     "has no per-layer timer)")
    off = modes.get("off")
    live = off["computed_rows_per_layer"] if off else next(iter(modes.values()))[
        "live_rows_per_layer"]
    rows_ax.plot(range(1, len(live) + 1), live, color="black", alpha=0.6,
                 label="live rows into the layer")
    if "auto" in modes:
        rep = modes["auto"]["computed_rows_per_layer"]
        rows_ax.plot(range(1, len(rep) + 1), rep, color="black", alpha=0.6, linestyle="--",
                     label="rows computed, auto (distinct rows)")
    rows_ax.set_yscale("log")
    rows_ax.set_ylabel("rows")
    if row["layers"] > 50:  # the first ~20 layers, where rows die, stay readable
        ax.set_xscale("log")
    ax.set_xlabel("layer" + (" (log scale)" if row["layers"] > 50 else ""))
    axes = [ax] if rows_ax is ax else [ax, rows_ax]
    handles = [h for a in axes for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              ncol=2)


def plot(results: list[dict], path: str | Path, config: tuple[int, int] | None) -> None:
    """Both panels into one PNG, written atomically."""
    from spdnn_mpi.util.atomic import atomic_path

    plt = pyplot()
    row = chosen_row(results, config)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    _rates_panel(ax1, results)
    _layers_panel(ax2, row)
    fig.suptitle(f"spdnn bench, {row['images']} images per run")
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
