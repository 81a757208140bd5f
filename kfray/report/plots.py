"""The report's figures, drawn with matplotlib's Agg canvas (no display, no pyplot state)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from kfray.candidate import TIER_NAMES
from kfray.report.data import Run, archive_cells, best_curve, migration_times

MEMORY = ("global", "vectorized", "smem tiles", "reg. blocking")
COMPUTE = ("multi-pass", "fused/FMA", "single-pass", "tiled")
PARALLEL = ("thread-only", "work-group", "warp/sub-group", "hierarchical")
TIER_COLOURS = {0: "#9e9e9e", 1: "#d62728", 2: "#ff7f0e", 3: "#e6c229", 4: "#9467bd", 5: "#2ca02c"}
DPI = 110


def _save(fig: Figure, path: Path) -> Path:
    """Every figure has the constrained layout, which keeps its labels inside the canvas: no
    bbox_inches="tight", which draws each figure twice to find its extent."""
    fig.savefig(path, dpi=DPI, facecolor="white")
    return path


def _labels(names: tuple, n: int) -> list[str]:
    return [names[i] if i < len(names) else str(i) for i in range(n)]


def archive_figure(run: Run, task: str, path: Path) -> Path:
    """One row per island, one panel per parallelism level; each panel memory (rows) x compute (cols).

    Correct elites are coloured by fitness (5 + speedup); failing ones by their tier (T0-T4)."""
    islands = run.island_ids(task) or [0]
    archives = {i: archive_cells(run, task, i) for i in islands}
    dims = next((tuple(st["archive"]["dims"]) for (t, _), st in run.islands.items() if t == task), (4, 4, 4))
    nm, nc, npar = (list(dims) + [1, 1, 1])[:3]
    fits = [v["fitness"] for a in archives.values() for v in a.values() if v["tier"] == 5]
    lo, hi = (min(fits), max(fits)) if fits else (5.0, 6.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    rows = len(islands)
    fig = Figure(figsize=(2.35 * npar + 1.2, 2.3 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, npar, squeeze=False)
    im = None
    for r, isl in enumerate(islands):
        arch = archives[isl]
        best = max(arch.values(), key=lambda v: v["fitness"], default=None)
        for p in range(npar):
            ax = axes[r][p]
            im = _archive_panel(ax, {c[:2]: v for c, v in arch.items() if len(c) == 3 and c[2] == p},
                                (nm, nc), lo, hi, best)
            ax.set_xticklabels(_labels(COMPUTE, nc) if r == rows - 1 else [], rotation=35, ha="right", fontsize=7.5)
            ax.set_yticklabels(_labels(MEMORY, nm) if p == 0 else [], fontsize=7.5)
            if r == 0:
                ax.set_title(f"parallelism: {_labels(PARALLEL, npar)[p]}", fontsize=9)
            if p == 0:
                ax.set_ylabel(f"island {isl}\n({len(arch)} cells)\nmemory", fontsize=8.5)
            if r == rows - 1:
                ax.set_xlabel("compute", fontsize=8.5)
    cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, pad=0.02)
    cb.set_label("fitness of correct elites (5 + speedup)")
    fig.suptitle(f"{task}: MAP-Elites archive per island (text: speedup, or T<tier> when failing; "
                 f"red box: island best)", fontsize=11)
    return _save(fig, path)


def _archive_panel(ax, cells: dict, shape: tuple, lo: float, hi: float, best: dict | None):
    """One memory x compute grid: imshow of correct fitness, tier-coloured squares for failing elites."""
    from matplotlib.patches import Rectangle

    grid = np.full(shape, np.nan)
    for (m, c), v in cells.items():
        if v["tier"] == 5:
            grid[m, c] = v["fitness"]
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=_cmap(), vmin=lo, vmax=hi, origin="lower", aspect="equal")
    ax.set_facecolor("#f1f1f1")
    for (m, c), v in cells.items():
        if v["tier"] == 5:
            txt, dark = f"{v['speedup']:.2f}x", (v["fitness"] - lo) / (hi - lo) < 0.55
        else:
            txt, dark = f"T{v['tier']}", False
            ax.add_patch(Rectangle((c - 0.5, m - 0.5), 1, 1, color=TIER_COLOURS.get(v["tier"], "#999"), alpha=0.45))
        ax.text(c, m, txt, ha="center", va="center", fontsize=7.5, color="white" if dark else "black",
                fontweight="bold" if v is best else "normal")
        if v is best:
            ax.add_patch(Rectangle((c - 0.46, m - 0.46), 0.92, 0.92, fill=False, edgecolor="#e8412c", linewidth=2))
    ax.set_xticks(range(shape[1]))
    ax.set_yticks(range(shape[0]))
    ax.set_xticks(np.arange(-0.5, shape[1], 1), minor=True)
    ax.set_yticks(np.arange(-0.5, shape[0], 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    return im


def _cmap():
    import matplotlib

    return matplotlib.colormaps["viridis"]


def curves_figure(run: Run, tasks: list[str], path: Path) -> Path:
    """Best fitness over time per island, one panel per task, migrations as vertical lines."""
    fig = Figure(figsize=(10, 2.6 * len(tasks) + 0.6), layout="constrained")
    axes = fig.subplots(len(tasks), 1, squeeze=False, sharex=True)[:, 0]
    end = max([c["created"] - run.t0 for c in run.cands] + [1.0])
    for ax, task in zip(axes, tasks):
        for k, t in enumerate(migration_times(run, task)):
            ax.axvline(t, color="#888", linestyle="--", linewidth=0.9, label="migration" if k == 0 else None)
        isls = run.island_ids(task)
        for k, isl in enumerate(isls):
            pts = best_curve(run, task, isl)
            if not pts:
                continue
            xs, ys, how = zip(*pts)
            colour = f"C{k % 10}"
            # wider lines first, so islands that share a best stay visible as nested stripes
            lw = 1.4 + 2.6 * (len(isls) - 1 - k) / max(1, len(isls) - 1)
            ax.step(list(xs) + [end], list(ys) + [ys[-1]], where="post", linewidth=lw, color=colour,
                    label=f"island {isl}", alpha=0.9)
            for kind, marker in (("own", "o"), ("migrant", "v")):
                sel = [(x, y) for x, y, h in pts if h == kind]
                if sel:
                    ax.scatter(*zip(*sel), marker=marker, s=36, color=colour, edgecolor="black",
                               linewidth=0.6, zorder=5)
        ax.scatter([], [], marker="o", color="white", edgecolor="black", label="own improvement")
        ax.scatter([], [], marker="v", color="white", edgecolor="black", label="migrant arrival")
        ax.set_title(task, fontsize=10, loc="left")
        ax.set_ylabel("best fitness")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xlabel("seconds since the run started")
    fig.suptitle("Best fitness per island (accepted migrants count at their arrival)", fontsize=11)
    return _save(fig, path)


def tiers_figure(run: Run, path: Path, bins: int = 24) -> Path:
    """Stacked bars: candidates per correctness tier in each time bin."""
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax = fig.subplots()
    ts = np.array([c["created"] - run.t0 for c in run.cands]) if run.cands else np.zeros(0)
    tiers = np.array([c["tier"] for c in run.cands])
    edges = np.linspace(0, max(ts.max() if len(ts) else 1.0, 1.0), bins + 1)
    width = edges[1] - edges[0]
    bottom = np.zeros(bins)
    for tier in sorted(TIER_NAMES):
        counts, _ = np.histogram(ts[tiers == tier], bins=edges)
        if counts.sum():
            ax.bar(edges[:-1], counts, width=width * 0.92, bottom=bottom, align="edge",
                   color=TIER_COLOURS[tier], label=f"{tier}: {TIER_NAMES[tier]} ({counts.sum()})")
            bottom += counts
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel(f"candidates per {width:.0f} s" if width >= 2 else f"candidates per {width:.1f} s")
    ax.set_title("Correctness tiers over time (all tasks)", fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def prompts_figure(run: Run, path: Path) -> Path:
    """Meta-prompt mean child score by generation: members (size = reports), parent links, mean line."""
    fig = Figure(figsize=(9, 3.8), layout="constrained")
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    scored = [p for p in run.prompts if p["reports"]]
    pos = {p["id"]: (p["generation"] + rng.uniform(-0.15, 0.15), p["mean"]) for p in scored}
    for p in scored:
        for par in p["parents"]:
            if par in pos:
                (x0, y0), (x1, y1) = pos[par], pos[p["id"]]
                ax.plot([x0, x1], [y0, y1], color="#bbb", linewidth=0.7, zorder=1)
    for alive, colour, label in ((0, "#7f9fbf", "retired"), (1, "#e8412c", "alive at the end")):
        ps = [p for p in scored if bool(p["alive"]) == bool(alive)]
        if ps:
            ax.scatter([pos[p["id"]][0] for p in ps], [p["mean"] for p in ps],
                       s=[18 + 10 * min(p["reports"], 20) for p in ps], color=colour, alpha=0.85,
                       edgecolor="black", linewidth=0.5, label=label, zorder=3)
    gens = sorted({p["generation"] for p in scored})
    if gens:
        means = [np.mean([p["mean"] for p in scored if p["generation"] == g]) for g in gens]
        ax.plot(gens, means, color="black", marker="D", markersize=4, linewidth=1.5,
                label="mean per generation", zorder=4)
        ax.set_xticks(gens)
    unscored = len(run.prompts) - len(scored)
    ax.set_xlabel("meta-prompt generation")
    ax.set_ylabel("mean score of children")
    ax.set_title("Meta-prompt fitness by generation (marker size = reports"
                 + (f"; {unscored} never scored, not shown)" if unscored else ")"), fontsize=11)
    ax.grid(alpha=0.3)
    if scored:
        ax.legend(fontsize=8, loc="best")
    else:
        ax.text(0.5, 0.5, "no meta-prompt has been scored yet", ha="center", va="center",
                transform=ax.transAxes)
    return _save(fig, path)


def lineage_figure(task: str, chain: list[dict], path: Path) -> Path:
    """The best kernel's ancestry: fitness of each step, labelled with the operator that made it."""
    long = len(chain) > 14
    fig = Figure(figsize=(min(22.0, max(6.0, (0.75 if long else 1.25) * len(chain) + 2)), 3.8 if long else 3.4),
                 layout="constrained")
    ax = fig.subplots()
    xs = np.arange(len(chain))
    ys = [c["fitness"] for c in chain]
    ax.plot(xs, ys, color="#555", linewidth=1.2, zorder=1)
    ax.scatter(xs, ys, s=70, c=[TIER_COLOURS.get(c["tier"], "#999") for c in chain], edgecolor="black", zorder=2)
    for x, c in zip(xs, chain):
        label = c["origin"].split(":", 1)[-1] if c["origin"] else "?"
        val = f"{c['speedup']:.2f}x" if c["tier"] == 5 else f"tier {c['tier']}"
        ax.annotate(f"{val} {label}" if long else f"{val}\n{label}", (x, c["fitness"]), textcoords="offset points",
                    xytext=(0, 9), ha="left" if long else "center", fontsize=7 if long else 7.5,
                    rotation=60 if long else 0)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{c['id'][:6]}\n{'seed' if c['island'] < 0 else 'isl ' + str(c['island'])}"
                        for c in chain], fontsize=7 if long else 7.5, rotation=90 if long else 0)
    lo, hi = min(ys), max(ys)
    ax.set_ylim(lo - 0.1 * (hi - lo + 0.1), hi + (0.8 if long else 0.35) * (hi - lo + 0.1))
    ax.set_ylabel("fitness")
    ax.set_title(f"{task}: lineage of the best kernel (root first; text: speedup and operator)", fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def timings_figure(task: str, rows: list[dict], path: Path) -> Path:
    """Per shape: reference, best kernel and (when known) roofline time; achieved rates under the bars."""
    fig = Figure(figsize=(max(6.0, 2.4 * len(rows) + 2.8), 3.6), layout="constrained")
    ax = fig.subplots()
    series = [("reference", "ref", "#7f9fbf"), ("best kernel", "time", "#2ca02c")]
    if any(r["roof"] for r in rows):
        series.append(("roofline bound", "roof", "#c8c8c8"))
    vals_all = [(r[k] or 0) * 1e3 for r in rows for _, k, _ in series if r[k]]
    log = bool(vals_all) and max(vals_all) / max(min(vals_all), 1e-12) > 30
    w = 0.8 / len(series)
    xs = np.arange(len(rows))
    for k, (label, key, colour) in enumerate(series):
        vals = [(r[key] or 0) * 1e3 for r in rows]
        bars = ax.bar(xs + (k - (len(series) - 1) / 2) * w, vals, width=w, color=colour, label=label,
                      edgecolor="black", linewidth=0.5)
        for b, r, v in zip(bars, rows, vals):
            top = f"{v:.3g} ms"
            if key == "time" and r["speedup"]:
                top += f"\n{r['speedup']:.2f}x"
            ax.annotate(top, (b.get_x() + b.get_width() / 2, b.get_height()), textcoords="offset points",
                        xytext=(0, 2), ha="center", va="bottom", fontsize=7.5)
    if log:
        ax.set_yscale("log")
    ax.margins(y=0.25)
    ax.set_xticks(xs)
    ax.set_xticklabels([_shape_label(r) for r in rows], fontsize=8)
    ax.set_ylabel("time per run (ms" + (", log)" if log else ")"))
    ax.set_title(f"{task}: best kernel per shape config (under each: achieved rates)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _shape_label(r: dict) -> str:
    text = f"{r['shape']}\n{r['gbps']:.3g} GB/s, {r['gflops']:.3g} GFLOP/s"
    if r["of_roof"]:
        text += f"\n{r['of_roof'] * 100:.0f} % of roofline ({r['bound']})"
    return text
