"""The text `spdnn bench` prints for configurations: the main table and its legend, the
simulated ranks, the first layers against the card's floor, the converged layers."""

from __future__ import annotations

from spdnn_mpi.bench.challenge import row_failed
from spdnn_mpi.bench.floors import CARDS, CONVERGED_ROWS
from spdnn_mpi.report import format_table


def runs_range(mode: dict) -> str:
    """``0.582-0.611``: the spread of one mode's timed runs, in seconds."""
    return f"{mode['seconds_min']:.3f}-{mode['seconds_max']:.3f}"


def _check(row: dict) -> str:
    checks = [m["check"] for m in row["modes"].values() if m.get("check")]
    checked = any(c["against"] != "off" for c in checks)  # truth or a peer, not auto=off
    if row_failed(row):
        return "FAIL"
    return "pass" if checked else "auto=off" if checks else "-"


def table(rows: list[dict], peers: list[str]) -> str:
    """One line per case: both modes side by side, the anchors (GPU runs) and our ratios."""
    gpu = any("anchors" in r for r in rows)
    headers = ["N", "L", "off_TE/s", "auto_TE/s", "computed", "auto/off"]
    if gpu:
        headers += ["A100_2020", "off/A100", "SNICIT", "auto/SNICIT"]
    headers += ["off_runs_s", "auto_runs_s", "e2e_s"] + (["compile_s"] if gpu else [])
    headers += ["alive", "check"]
    for peer in peers:
        headers += [f"{peer}_s", f"x{peer}"]
    out = []
    for r in rows:
        off, auto = r["modes"].get("off"), r["modes"].get("auto")
        off_t = off["teraedges_per_second"] if off else None
        auto_t = auto["teraedges_per_second"] if auto else None
        line = [r["neurons"], r["layers"], off_t, auto_t,
                auto["computed_teraedges_per_second"] if auto else None,
                auto_t / off_t if off_t and auto_t else None]
        if gpu:
            anchors = r.get("anchors", {})
            a100, snicit = anchors.get("paper_2020_a100"), anchors.get("snicit_a6000")
            line += [a100, off_t / a100 if off_t and a100 else None,
                     snicit, auto_t / snicit if auto_t and snicit else None]
        line += [runs_range(off) if off else None, runs_range(auto) if auto else None,
                 (auto or off)["end_to_end_seconds"]]
        if gpu:  # a star: this case compiled the kernels (else: this process or the cache had them)
            line.append(f"{r.get('compile_seconds', 0.0):.3f}"
                        + ("*" if r.get("kernels_compiled") else ""))
        line += [(auto or off)["alive_at_end"], _check(r)]
        for peer in peers:
            pr = r["peers"].get(peer, {})
            line += [pr.get("seconds"), pr.get("speedup")]
            if pr and "agrees" in pr and not pr["agrees"]:
                line[-1] = "DISAGREE"
        out.append(line)
    legend = ("TE/s: nominal challenge rate (images x all edges / median inference time of "
              "--repeat runs); computed: edges actually multiplied / time (auto); off: every "
              "live row computed; auto: each group of bit-identical rows once. ")
    if gpu:
        legend += ("A100_2020 and SNICIT: published TE/s (2020 paper, one A100; SNICIT 2023, "
                   "one RTX A6000). ")
    legend += ("off_runs_s, auto_runs_s: fastest-slowest of each mode's timed runs. e2e_s: "
               "store read + layout + inputs + inference + categories file. ")
    if gpu:
        legend += ("compile_s: the kernels' compilation or loading, inside e2e_s (* compiled "
                   "by this case; else loaded from the process or CuPy's disk cache). ")
    legend += ("<peer>_s: the "
               "peer's time (one run after a warm-up); x<peer>: the peer's time over ours "
               "(off). check: pass = the categories equal the truth or a peer's; auto=off = "
               "the two modes agree, with no truth or peer to check them.")
    return format_table(headers, out) + "\n" + legend


def ranks_text(rows: list[dict]) -> str:
    """One line per case and simulated rank count P; '' without --ranks-sim."""
    lines = []
    for r in rows:
        sims = {m: {s["ranks"]: s for s in mode.get("ranks_sim_all", [])}
                for m, mode in r["modes"].items()}
        counts = list(dict.fromkeys(p for by_p in sims.values() for p in by_p))  # as asked
        for p in counts:
            line = [r["neurons"], r["layers"], p]
            for m in ("off", "auto"):
                s = sims.get(m, {}).get(p)
                line += [s["projected_speedup"] if s else None, s["imbalance"] if s else None,
                         s["projected_edges_per_second"] / 1e12 if s else None]
            lines.append(line)
    if not lines:
        return ""
    headers = ["N", "L", "P", "off_proj_x", "off_imbalance", "off_proj_TE/s",
               "auto_proj_x", "auto_imbalance", "auto_proj_TE/s"]
    return ("simulated ranks (--ranks-sim): each of P count-balanced partitions run in "
            "turn on this device\n" + format_table(headers, lines)
            + "\nproj_x: the whole run's median / the slowest partition (projected P-rank "
              "speed-up); imbalance: slowest / mean partition time; proj_TE/s: nominal rate "
              "of the projected P-rank run.")


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 0.1 else f"{value:.2g}"


def _floor_legend(results: list[dict]) -> str:
    """What the floors of these tables are: the card's ceilings, or why there is none."""
    known = sorted({(fl["ceilings"]["card"], fl["ceilings"]["hbm_bytes_per_s"],
                     fl["ceilings"]["fma_per_s"])
                    for r in results if (fl := r.get("first_layers")) and fl["ceilings"]})
    unknown = sorted({fl["device"] or "?" for r in results
                      if (fl := r.get("first_layers")) and not fl["ceilings"]})
    parts = []
    bits = any((fl := r.get("first_layers")) and fl.get("input_bits") for r in results)
    for card, hbm, fma in known:
        parts.append(f"floor: one {card}, max(HBM bytes / {hbm / 1e12:.1f}e12 B/s, fp32 FMAs "
                     f"/ {fma / 1e12:.1f}e12/s); bytes = 4 B x rows_in x (n_in + n_out) + 2 B "
                     "per weight index; FMAs = nonzeros x rows_in. %floor = floor / measured "
                     "(100 = at the floor). %1pass: against the one-pass floor, where a layer "
                     "reads the rows_in of the layer before it (a row's death is known only "
                     "once all its outputs are, so the layer that ends a row still writes it "
                     "and the next one reads it).")
    if bits:
        parts.append("Layer 1 read its binary inputs as bits: 1/8 B an input in its floor.")
    for device in unknown:
        cards = ", ".join(c.name for c in CARDS)
        parts.append(f"no floor: the device {device!r} is not in the card table "
                     f"(spdnn_mpi.bench.floors.CARDS: {cards}); measured times only.")
    parts.append("measured: per-layer device time of the last timed run.")
    return " ".join(parts)


def first_layers_text(results: list[dict]) -> str:
    """One short table per configuration that has the first-layers rows; '' if none."""
    parts = []
    for r in results:
        fl = r.get("first_layers")
        if not fl:
            continue
        lines = [[x["layer"], x["rows_in"], _us(x["measured_us"]), _us(x["floor_us"]),
                  x["bound"] or "-", _pct(x["percent_of_floor"]),
                  _pct(x["percent_of_one_pass_floor"])] for x in fl["rows"]]
        for key in ("first", "all") if fl["all"]["layers"] > fl["k"] else ("first",):
            t = fl[key]
            lines.append([f"{key} {t['layers']}", "", _us(t["measured_us"]),
                          _us(t["floor_us"]), "", _pct(t["percent_of_floor"]),
                          _pct(t["percent_of_one_pass_floor"])])
        card = fl["card"] or f"no floor for {fl['device']}"
        parts.append(f"first {fl['k']} layers of {r['neurons']}x{r['layers']}, off (direct), "
                     f"backend {r['backend']}, {card}:\n"
                     + format_table(["layer", "rows_in", "measured_us", "floor_us", "bound",
                                     "%floor", "%1pass"], lines))
    if not parts:
        return ""
    return "\n\n".join(parts) + "\n" + _floor_legend(results)


def converged_text(results: list[dict]) -> str:
    """One line per case with the auto mode's converged layers; '' if none was timed so."""
    lines = []
    for r in results:
        c = r.get("converged_layers")
        if c is None:
            continue
        name = f"{r['neurons']}x{r['layers']}"
        if not c["layers"]:
            lines.append(f"  {name}: none (every layer computed more than "
                         f"{c['rows_at_most']} rows)")
            continue
        lines.append(f"  {name}: {c['layers']} layers (from layer {c['first_layer']}), median "
                     f"{c['median_us']:.1f} us (fastest-slowest {c['min_us']:.1f}-"
                     f"{c['max_us']:.1f})")
    if not lines:
        return ""
    return (f"converged layers, auto (compressed): layers that computed at most "
            f"{CONVERGED_ROWS} rows (one tile), per-layer time of the last timed run\n"
            + "\n".join(lines))


def report(results: list[dict], peers: list[str]) -> str:
    """Everything printed for configurations, in order, blank lines between the parts."""
    parts = [table(results, peers), ranks_text(results), first_layers_text(results),
             converged_text(results)]
    return "\n\n".join(p for p in parts if p)
