"""The parts of `spdnn bench` for configurations beyond the main table.

The first-layers table (the direct mode's measured time per layer against
the H200 floor of ``spdnn_mpi.bench.floors``) and ``--plot FILE.png``: TE/s per
configuration, both modes, against the published anchors, and time and live
rows per layer of one configuration (``--plot-config``). The options are
checked before anything long runs, the PNG is written atomically.
"""

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
    """Refuse --plot/--plot-config combinations that cannot work, before the run.

    ``store_cases`` (store, layers) and ``configs`` (generated N x L) are
    what will run; --plot-config must name one of them.
    """
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


def add_first_layers(row: dict, network, k: int) -> None:
    """The off mode's first ``k`` layers against their floors, into ``row`` (if timed)."""
    from spdnn_mpi.bench.floors import first_layers, network_floors

    off = row["modes"].get("off")
    if k <= 0 or off is None or off.get("layer_seconds") is None:
        return
    rows_in = off["computed_rows_per_layer"]
    row["first_layers"] = {"mode": "off", **first_layers(network, rows_in,
                                                         off["layer_seconds"], k)}
    row["first_layers"]["floor_us_per_layer"] = [1e6 * f["seconds"] for f in
                                                 network_floors(network, rows_in)]


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 0.1 else f"{value:.2g}"


def first_layers_text(results: list[dict]) -> str:
    """One short table per configuration that has the first-layers rows; '' if none."""
    from spdnn_mpi.report import format_table

    parts = []
    for r in results:
        fl = r.get("first_layers")
        if not fl:
            continue
        lines = [[x["layer"], x["rows_in"], _us(x["measured_us"]), _us(x["floor_us"]),
                  x["bound"], _pct(x["percent_of_floor"])] for x in fl["rows"]]
        for key in ("first", "all") if fl["all"]["layers"] > fl["k"] else ("first",):
            t = fl[key]
            lines.append([f"{key} {t['layers']}", "", _us(t["measured_us"]),
                          _us(t["floor_us"]), "", _pct(t["percent_of_floor"])])
        parts.append(f"first {fl['k']} layers of {r['neurons']}x{r['layers']}, off (direct), "
                     f"backend {r['backend']}:\n"
                     + format_table(["layer", "rows_in", "measured_us", "floor_us", "bound",
                                     "%floor"], lines))
    if not parts:
        return ""
    legend = ("floor: one H200, max(HBM bytes / 4.3e12 B/s, fp32 FMAs / 33.5e12/s); bytes = "
              "4 B x rows_in x (n_in + n_out) + 2 B per weight index; FMAs = nonzeros x "
              "rows_in. %floor = floor / measured (100 = at the floor). measured: per-layer "
              "time of the last timed run (on the cpu backend the H200 floor is only a scale).")
    return "\n\n".join(parts) + "\n" + legend


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
         lambda r: r["anchors"]["paper_2020_a100"]),
        ("SNICIT, one RTX A6000 (compressed, nominal)", "^", "--",
         lambda r: r["anchors"]["snicit_a6000"]),
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
    none = all(r["anchors"]["paper_2020_a100"] is None and r["anchors"]["snicit_a6000"] is None
               for r in results)
    ax.set_title(f"(a) TE/s per configuration N x L, spdnn backend {backend}"
                 + ("\n(no published anchors for these configurations)" if none else ""))
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
        floor = row.get("first_layers", {}).get("floor_us_per_layer")
        if floor and row["backend"] == "cuda":
            ax.plot(range(1, len(floor) + 1), floor, linestyle=":",
                    label="H200 floor, off (HBM / FMA model)")
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
