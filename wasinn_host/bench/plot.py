"""``wasinn bench --plot``: tokens/s against guests as a self-contained SVG chart.

One line per series (the host's guests computing and streaming, llama.cpp alone and with its sampler),
guests on a logarithmic axis (1, 8, 32, 64 spread evenly enough to read), tokens/s from zero.  Every
point is a ``<circle>`` carrying its series, guests and tokens/s as ``data-`` attributes and a
``<title>`` (the value on hover), so the figures can be read back from the file.  Written by hand: a
few dozen elements need no plotting library, and the file is the same on every machine.
"""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape, quoteattr

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50
COLOURS = {"compute": "#1f77b4", "stream": "#2ca02c", "llama.cpp": "#d62728", "llama.cpp+sampler": "#ff7f0e"}
DASHED = {"llama.cpp", "llama.cpp+sampler"}


def series_from(report: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """(guests, tokens/s) points per series from ``wasinn bench --json``'s report."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in report["host"]:
        series.setdefault(row["way"], []).append((row["guests"], row["tokens_per_s"]))
    for row in report["llama_cpp"]:
        series.setdefault("llama.cpp", []).append((row["guests"], row["tokens_per_s"]))
        series.setdefault("llama.cpp+sampler", []).append((row["guests"], row["sampled_tokens_per_s"]))
    return series


def chart_title(report: dict[str, Any]) -> str:
    """The chart's title: the model, the tokens, llama.cpp's threads and the date of ``report``."""
    model = report["model"].replace("\\", "/").rsplit("/", 1)[-1]
    threads = f"{report['threads']} llama.cpp thread{'s' if report['threads'] != 1 else ''}"
    return f"wasinn bench: {model}, {report['tokens']} tokens a guest, {threads}, {report['date']}"


def _nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def svg_chart(report: dict[str, Any], title: str) -> str:
    """The chart of ``report`` (``wasinn bench --json``'s object) as SVG text."""
    series = series_from(report)
    guests = sorted({n for points in series.values() for n, _ in points})
    top = _nice_top(max((v for points in series.values() for _, v in points), default=1.0) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    low, high = math.log(guests[0]), math.log(guests[-1])

    def x(n: int) -> float:
        return LEFT + (plot_w / 2 if high == low else (math.log(n) - low) / (high - low) * plot_w)

    def y(v: float) -> float:
        return TOP + plot_h - v / top * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for i in range(6):  # horizontal grid and tokens/s labels
        value = top * i / 5
        out.append(
            f'<line x1="{LEFT}" y1="{y(value):.1f}" x2="{LEFT + plot_w}" y2="{y(value):.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:g}</text>'
        )
    for n in guests:
        out.append(
            f'<line x1="{x(n):.1f}" y1="{TOP + plot_h}" x2="{x(n):.1f}" y2="{TOP + plot_h + 5}" stroke="#333"/>'
            f'<text x="{x(n):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{n}</text>'
        )
    out.append(
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#333"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#333"/>'
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 12}" text-anchor="middle">guests at once</text>'
        f'<text x="16" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + plot_h / 2:.1f})">tokens/s (all guests)</text>'
    )
    for index, (name, points) in enumerate(series.items()):
        colour = COLOURS.get(name, "#555")
        label = name if name in DASHED else f"wasinn, {name}"
        dash = ' stroke-dasharray="6 4"' if name in DASHED else ""
        path = " ".join(f"{x(n):.1f},{y(v):.1f}" for n, v in sorted(points))
        out.append(f"<g data-series={quoteattr(name)}>")
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for n, v in sorted(points):
            out.append(
                f'<circle cx="{x(n):.1f}" cy="{y(v):.1f}" r="3.5" fill="{colour}" data-guests="{n}" '
                f'data-tokens-per-s="{v:g}"><title>{escape(label)}: {n} guest{"s" if n != 1 else ""}, {v:.1f} tokens/s'
                f"</title></circle>"
            )
        legend_y = TOP + 10 + index * 20
        out.append(
            f'<line x1="{WIDTH - RIGHT + 15}" y1="{legend_y}" x2="{WIDTH - RIGHT + 40}" y2="{legend_y}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
            f'<text x="{WIDTH - RIGHT + 46}" y="{legend_y + 4}">{escape(label)}</text>'
        )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
