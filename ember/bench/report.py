"""What ``ember bench`` prints and draws; both are made from the report dict that is saved as JSON,
so the table, the chart and the file always show the same numbers."""
from __future__ import annotations

import math


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(report: dict) -> str:
    lines = [f"ember bench: suite {report['suite']!r} on {report['device_name']}, {report['dtype']}; "
             f"torch {report['torch']}, ember {report['ember']}, {report['torch_threads']} CPU thread(s)",
             f"median of {report['iters']} calls after {report['warmup']} warm-up, eager and compiled timed in turns; "
             "speedup = eager ms / variant ms, measured in the same process", "",
             f"{'workload':<11} {'variant':<22} {'ms/call':>10} {'speedup':>8} {'first call s':>13} "
             f"{'max abs err':>12}  status"]
    for r in report["results"]:
        ok = r.get("ms") is not None
        lines.append(f"{r['workload']:<11} {r['variant']:<22} {_fmt(r.get('ms'), '.3f'):>10} "
                     f"{(_fmt(r.get('speedup'), '.2f') + 'x') if ok else '-':>8} "
                     f"{_fmt(r.get('compile_s'), '.2f'):>13} {_fmt(r.get('max_abs_err'), '.1e'):>12}  "
                     f"{r['status']}{': ' + r['error'] if r.get('error') else ''}")
    lines.append("")
    for variant, value in geomeans(report).items():
        lines.append(f"geomean speedup over eager, {variant}: {value:.2f}x")
    return "\n".join(lines)


def geomeans(report: dict) -> dict[str, float]:
    """Per compiled variant, the geometric mean speedup over the workloads where it matched eager."""
    by_variant: dict[str, list] = {}
    for r in report["results"]:
        if r["variant"] != "eager" and r["status"] == "ok" and r.get("speedup"):
            by_variant.setdefault(r["variant"], []).append(r["speedup"])
    return {v: math.exp(sum(map(math.log, s)) / len(s)) for v, s in by_variant.items()}


def plot(report: dict, path: str) -> None:
    """Two panels: speedup over eager per workload, and first-call (compile) time, one bar per variant."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if r["variant"] != "eager" and r["status"] == "ok"]
    names = list(dict.fromkeys(r["workload"] for r in report["results"]))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    value = {(r["workload"], r["variant"]): r for r in rows}
    fig, (ax_speed, ax_compile) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(names) + 4), 4.5))
    width = 0.8 / max(1, len(variants))
    for i, variant in enumerate(variants):
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(names))]
        for ax, key, fmt in ((ax_speed, "speedup", "{:.2f}x"), (ax_compile, "compile_s", "{:.1f}")):
            ys = [(value.get((n, variant)) or {}).get(key) or 0.0 for n in names]
            bars = ax.bar(xs, ys, width, label=variant)
            for bar, y in zip(bars, ys):
                if y:
                    ax.annotate(fmt.format(y), (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom",
                                fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax_speed.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax_speed.set_ylabel("speedup over eager (higher is better)")
    ax_compile.set_ylabel("first call incl. compile, s (lower is better)")
    for ax in (ax_speed, ax_compile):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right")
        ax.margins(y=0.15)
        ax.legend(fontsize=8)
    fig.suptitle(f"ember bench, suite {report['suite']!r}: {report['device_name']}, {report['dtype']}, "
                 f"torch {report['torch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
