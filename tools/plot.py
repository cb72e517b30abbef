#!/usr/bin/python3
"""ballast's plots, drawn with matplotlib (Debian: python3-matplotlib).

    /usr/bin/python3 tools/plot.py compare  COMPARE.json  OUT.svg|OUT.png
    /usr/bin/python3 tools/plot.py timeline TIMELINE.json OUT.svg|OUT.png
    /usr/bin/python3 tools/plot.py check    # exit 0 when matplotlib imports, else 4

`ballast compare --plot FILE` and `ballast simulate --plot FILE` write their JSON
(schemas ballast.compare/1 and ballast.timeline/1, docs/cli.md) to a temporary file and
run this script; it is kept out of the C++ library and its unit tests. Output is
deterministic: the same JSON gives a byte-identical SVG or PNG.
"""

import json
import sys

EXIT_NO_MATPLOTLIB = 4  # tools/ballast/plot.cpp: kPlotExitNoMatplotlib

# Timeline colours by event category (docs/simulator.md section 6): attention by scheme and
# tier in strong colours, the linear modules and per-micro-batch overhead in pale ones.
CATEGORY_COLOURS = {
    "linear": "#b9cde5",
    "overhead": "#e6d5a1",
    "local": "#2ca02c",
    "ring intra-node": "#ff7f0e",
    "ring inter-node": "#d62728",
    "ulysses intra-node": "#9467bd",
    "ulysses inter-node": "#5b2a86",
    "usp intra-node": "#aec7e8",
    "usp inter-node": "#1f77b4",
    "all-gather intra-node": "#e377c2",
    "all-gather inter-node": "#8c564b",
    "remap": "#17becf",
    "gradient sync": "#595959",
    "tensor parallel": "#bcbd22",
    "expert parallel": "#aec7e8",
    "": "#000000",
}
CATEGORY_ORDER = list(CATEGORY_COLOURS)

# Compare bars by strategy (the part of a spec before ':').
STRATEGY_COLOURS = {
    "packed-dp": "#8c8c8c",
    "static-cp": "#7f7f7f",
    "static-cp-allgather": "#a6a6a6",
    "static-ulysses": "#969696",
    "batch-adaptive": "#6baed6",
    "hybrid-dp": "#9ecae1",
    "flexsp": "#9467bd",
    "flexsp-fast": "#c5b0d5",
    "zeppelin": "#d62728",
}

MAX_ROWS_ALL = 64  # timelines of up to this many ranks show every rank
ROWS_SHOWN = 32    # larger clusters: the ranks that finish their work last


def load_matplotlib():
    """pyplot on the Agg backend with settings that make output reproducible."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "ballast"  # stable ids in the SVG
    matplotlib.rcParams["path.simplify"] = True
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable
    import matplotlib.pyplot as plt
    return plt


def save(fig, path):
    if path.lower().endswith(".svg"):
        metadata = {"Date": None, "Creator": "ballast tools/plot.py"}
    else:
        metadata = {"Software": "ballast tools/plot.py"}
    fig.savefig(path, metadata=metadata, dpi=150, bbox_inches="tight")


def settings_line(settings):
    parts = [settings.get("dataset", ""), settings.get("cluster_description", ""),
             settings.get("model", ""), "cost model " + settings.get("cost_model", "")]
    steps = settings.get("steps")
    if steps:
        parts.append(f"mean of {steps} step{'s' if steps != 1 else ''}")
    return ", ".join(p for p in parts if p)


def plot_compare(data, path):
    """Horizontal bars of mean step time per strategy, the lower bound, the speedups."""
    plt = load_matplotlib()
    results = data["results"]
    settings = data.get("settings", {})
    baseline = settings.get("baseline", "")
    rows = len(results)
    fig, ax = plt.subplots(figsize=(8.5, 1.2 + 0.42 * rows))
    longest = max([r["step_time_s"] for r in results if not r["error"]] + [1e-9])
    bounds = [r["lower_bound_s"] for r in results if not r["error"] and r["lower_bound_s"] > 0]
    shared_bound = bounds and max(bounds) - min(bounds) <= 1e-9 * max(bounds)
    for y, row in enumerate(results):
        name = row["strategy"]
        if row["error"]:
            reason = row["error"].split(";")[0]
            reason = reason if len(reason) <= 90 else reason[:87] + "..."
            ax.text(0, y, f"  cannot run: {reason}", va="center", fontsize=7, color="#555555")
            continue
        colour = STRATEGY_COLOURS.get(name.split(":")[0], "#7f7f7f")
        ax.barh(y, row["step_time_s"], height=0.62, color=colour,
                edgecolor="black" if name == baseline else colour, linewidth=0.8,
                hatch="//" if name == baseline else None)
        if name == baseline:
            speedup = "baseline"
        elif row["speedup"] is not None:
            speedup = f"{row['speedup']:.2f}x"
        else:
            speedup = "(baseline cannot run)"
        gap = f"+{100 * row['gap_to_lower_bound']:.0f}% over bound"
        ax.text(row["step_time_s"] + 0.01 * longest, y,
                f"{row['step_time_s']:.3f} s  {speedup}  ({gap})", va="center", fontsize=8)
        if not shared_bound and row["lower_bound_s"] > 0:
            ax.plot([row["lower_bound_s"]] * 2, [y - 0.36, y + 0.36], color="black", linewidth=1.6)
    if shared_bound:
        ax.axvline(bounds[0], color="black", linestyle="--", linewidth=1.0)
        ax.text(bounds[0], -0.75, f"lower bound {bounds[0]:.3f} s", ha="center", fontsize=8)
    ax.set_yticks(range(rows))
    ax.set_yticklabels([r["strategy"] for r in results], fontsize=8)
    ax.invert_yaxis()
    ax.set_ylim(rows - 0.5, -1.1)
    ax.set_xlim(0, longest * 1.45)
    ax.set_xlabel("mean step time (s); lower is better")
    title = "ballast compare"
    if settings.get("scenario"):
        title += f": scenario {settings['scenario']}"
    ax.set_title(title + "\n" + settings_line(settings), fontsize=9)
    marker = "dashed line" if shared_bound else "black tick"
    ax.annotate(f"speedup: {baseline or 'baseline'} step time / strategy step time. {marker}: "
                "the lower bound no plan can beat (docs/simulator.md).",
                xy=(0, 0), xycoords="axes fraction", xytext=(0, -36), textcoords="offset points",
                va="top", fontsize=7, color="#444444")
    ax.spines[["top", "right"]].set_visible(False)
    save(fig, path)


def merged(intervals):
    """Sorted, disjoint union of (start, end) intervals."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def split_by(intervals, cover):
    """(parts inside cover, parts outside it) of sorted disjoint intervals; cover too."""
    inside, outside = [], []
    j = 0
    for start, end in intervals:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        position = start
        k = j
        while k < len(cover) and cover[k][0] < end:
            c_start, c_end = cover[k]
            if c_start > position:
                outside.append((position, c_start))
            low, high = max(position, c_start), min(end, c_end)
            if high > low:
                inside.append((low, high))
            position = max(position, high)
            k += 1
        if position < end:
            outside.append((position, end))
    return inside, outside


def joined(intervals, tolerance):
    """Neighbouring intervals closer than tolerance drawn as one (fewer shapes, same look)."""
    out = []
    for start, end in sorted(intervals):
        if out and start - out[-1][1] <= tolerance:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e - s) for s, e in out]


def rows_to_show(data, events):
    """Every rank up to MAX_ROWS_ALL, else the ROWS_SHOWN that finish compute last."""
    ranks = len(data["ranks"])
    if ranks <= MAX_ROWS_ALL:
        return list(range(ranks)), ""
    compute_end = [0.0] * ranks
    for e in events:
        if e["lane"] == "compute":
            compute_end[e["rank"]] = max(compute_end[e["rank"]], e["start_s"] + e["duration_s"])
    slowest = sorted(range(ranks), key=lambda r: (-compute_end[r], r))[:ROWS_SHOWN]
    return sorted(slowest), f"; the {ROWS_SHOWN} of {ranks} ranks that finish compute last"


#: How the timeline marks a micro-batch boundary (a short dotted tick on the rank's row) and
#: the step's end (a solid line over every row): two glyphs a reader can tell apart.
MICRO_BATCH_BOUNDARY_STYLE = {"color": "#444444", "linestyle": ":", "linewidth": 1.0}
STEP_END_STYLE = {"color": "black", "linestyle": "-", "linewidth": 1.6}


def timeline_legend_handles(categories, communicating, latest):
    """The timeline's legend: compute colours per category, then communication drawn as the
    bands are (the colour of the first category that communicates, pale where hidden and
    full where exposed), the micro-batch boundary and step end glyphs, the lower bound and
    the rank that finishes last."""
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D
    handles = [Patch(facecolor=CATEGORY_COLOURS[c], label=c or "other")
               for c in CATEGORY_ORDER if c in categories]
    talking = [c for c in CATEGORY_ORDER if c in communicating]
    band = CATEGORY_COLOURS[talking[0]] if talking else "#999999"
    handles += [
        Patch(facecolor=band, alpha=0.3, label="communication (thin band, its scheme's colour), hidden"),
        Patch(facecolor=band, label="communication, exposed"),
        Line2D([], [], label="micro-batch boundary", **MICRO_BATCH_BOUNDARY_STYLE),
        Line2D([], [], color="black", linestyle="--", linewidth=0.9, label="lower bound"),
        Line2D([], [], label="step end", **STEP_END_STYLE),
        Line2D([], [], color="#d62728", linewidth=0, marker="s",
               label=f"rank {latest}: last to finish compute"),
    ]
    return handles


def plot_timeline(data, path):
    """One row per rank: compute by category, communication as a thin band under it
    (pale where the rank's compute hides it, full colour where exposed), idle as gaps."""
    plt = load_matplotlib()
    events = data["events"]
    step_s = data["step_time_s"]
    shown, note = rows_to_show(data, events)
    row_of = {rank: i for i, rank in enumerate(shown)}
    gpus_per_node = max(1, data.get("gpus_per_node", 1))
    tolerance = step_s * 2e-4
    compute = {r: {} for r in shown}
    talking = {r: {} for r in shown}
    micro_batch_start = {r: {} for r in shown}
    for e in events:
        r = e["rank"]
        if r not in row_of:
            continue
        interval = (e["start_s"], e["start_s"] + e["duration_s"])
        target = compute if e["lane"] == "compute" else talking
        target[r].setdefault(e["category"], []).append(interval)
        m = e["micro_batch"]
        if m >= 0:
            micro_batch_start[r][m] = min(micro_batch_start[r].get(m, interval[0]), interval[0])
    height = max(3.0, min(13.0, 1.4 + 0.17 * len(shown)))
    fig, ax = plt.subplots(figsize=(11, height))
    categories = set()
    communicating = set()
    last_compute = {}
    for r in shown:
        y = row_of[r]
        busy = merged([i for intervals in compute[r].values() for i in intervals])
        last_compute[r] = busy[-1][1] if busy else 0.0
        for category in sorted(compute[r], key=CATEGORY_ORDER.index):
            categories.add(category)
            ax.broken_barh(joined(compute[r][category], tolerance), (y - 0.42, 0.6),
                           facecolors=CATEGORY_COLOURS.get(category, "#000000"), linewidth=0)
        for category in sorted(talking[r], key=CATEGORY_ORDER.index):
            categories.add(category)
            communicating.add(category)
            hidden, exposed = split_by(merged(talking[r][category]), busy)
            colour = CATEGORY_COLOURS.get(category, "#000000")
            ax.broken_barh(joined(hidden, tolerance), (y + 0.2, 0.22), facecolors=colour,
                           alpha=0.3, linewidth=0)
            ax.broken_barh(joined(exposed, tolerance), (y + 0.2, 0.22), facecolors=colour,
                           linewidth=0)
        boundaries = [t for m, t in micro_batch_start[r].items() if m > 0]
        if boundaries:
            ax.vlines(boundaries, y - 0.48, y + 0.48, colors=MICRO_BATCH_BOUNDARY_STYLE["color"],
                      linestyles=MICRO_BATCH_BOUNDARY_STYLE["linestyle"],
                      linewidth=MICRO_BATCH_BOUNDARY_STYLE["linewidth"])
    for i in range(1, len(shown)):
        if shown[i] // gpus_per_node != shown[i - 1] // gpus_per_node:
            ax.axhline(i - 0.5, color="#888888", linewidth=0.6)
    ax.axvline(step_s, **STEP_END_STYLE)
    bound_s = data.get("lower_bound_s", 0)
    if bound_s > 0:
        ax.axvline(bound_s, color="black", linestyle="--", linewidth=0.9)
    latest = max(shown, key=lambda r: (last_compute[r], -r))
    ax.set_yticks(range(len(shown)))
    labels = [f"{r} (n{r // gpus_per_node})" for r in shown]
    ax.set_yticklabels(labels, fontsize=max(4.5, min(8.0, 260 / max(1, len(shown)))))
    ax.get_yticklabels()[row_of[latest]].set_color("#d62728")
    ax.get_yticklabels()[row_of[latest]].set_fontweight("bold")
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(0, step_s * 1.01)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("rank (node); gray lines separate nodes")
    ax.set_title(
        f"{data['strategy']}: step {data['step']} takes {step_s:.3f} s (lower bound "
        f"{bound_s:.3f} s), imbalance {data['imbalance']:.2f}, exposed communication "
        f"{100 * data['exposed_comm_fraction']:.1f}%\n{data.get('cluster', '')}, "
        f"{data.get('model', '')}, {data.get('sequences', 0)} sequences, "
        f"{data['micro_batches']} micro-batch{'es' if data['micro_batches'] != 1 else ''}{note}",
        fontsize=9)
    handles = timeline_legend_handles(categories, communicating, latest)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    save(fig, path)


def main(argv):
    if len(argv) >= 2 and argv[1] == "check":
        try:
            load_matplotlib()
        except ImportError:
            return EXIT_NO_MATPLOTLIB
        return 0
    if len(argv) != 4 or argv[1] not in ("compare", "timeline"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        load_matplotlib()
    except ImportError:
        print("tools/plot.py needs matplotlib: sudo apt-get install python3-matplotlib",
              file=sys.stderr)
        return EXIT_NO_MATPLOTLIB
    with open(argv[2], encoding="utf-8") as f:
        data = json.load(f)
    (plot_compare if argv[1] == "compare" else plot_timeline)(data, argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
