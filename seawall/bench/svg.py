"""Hand-written SVG charts for the HTML report (no plotting library): lines, points and bars with axes."""

from __future__ import annotations

import math
from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
W, H = 680, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 30, 44

Series = dict[str, list[tuple[float, float]]]


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [first], first
    while t < hi - step * 1e-9:  # the last tick is at or above hi
        t += step
        ticks.append(round(t, 12))
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if 1000 <= abs(v) < 1e6:
        return f"{v:.0f}"
    if abs(v) >= 1e6 or abs(v) < 0.01:
        return f"{v:.3g}"
    return f"{v:.4g}"


class _Frame:
    def __init__(self, xs: list[float], ys: list[float], y_from_zero: bool = True) -> None:
        x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        y_lo, y_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
        if y_from_zero:
            y_lo = min(0.0, y_lo)
        self.xt = nice_ticks(x_lo, x_hi)
        self.yt = nice_ticks(y_lo, y_hi)
        self.x0, self.x1 = self.xt[0], self.xt[-1] if self.xt[-1] > self.xt[0] else self.xt[0] + 1
        self.y0, self.y1 = self.yt[0], self.yt[-1] if self.yt[-1] > self.yt[0] else self.yt[0] + 1

    def x(self, v: float) -> float:
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return H - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)

    def axes(self, title: str, xlabel: str, ylabel: str) -> list[str]:
        out = [f'<text x="{W / 2 - RIGHT / 2:.0f}" y="18" text-anchor="middle" font-weight="bold">{escape(title)}'
               "</text>"]
        for t in self.xt:
            x = self.x(t)
            out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="#eee"/>')
            out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{_fmt(t)}</text>')
        for t in self.yt:
            y = self.y(t)
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        out.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
                   'fill="none" stroke="#999"/>')
        out.append(f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 8}" text-anchor="middle">{escape(xlabel)}</text>')
        out.append(f'<text transform="translate(14 {(TOP + H - BOTTOM) / 2:.0f}) rotate(-90)" '
                   f'text-anchor="middle">{escape(ylabel)}</text>')
        return out


def _svg(body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
            'font-family="sans-serif" font-size="11">' + "".join(body) + "</svg>")


def _legend(names: list[str]) -> list[str]:
    out = []
    for i, name in enumerate(names):
        y = TOP + 14 * i + 6
        out.append(f'<rect x="{W - RIGHT + 10}" y="{y - 8}" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{W - RIGHT + 24}" y="{y + 1}">{escape(name)}</text>')
    return out


def line_chart(title: str, series: Series, xlabel: str, ylabel: str, *, points: bool = False,
               vlines: list[float] = (), step: bool = False) -> str:
    """One line (or cloud of points) per series; ``vlines`` mark times such as bursts."""
    xs = [x for s in series.values() for x, _ in s] + list(vlines)
    ys = [y for s in series.values() for _, y in s]
    f = _Frame(xs, ys)
    body = f.axes(title, xlabel, ylabel)
    for v in vlines:
        body.append(f'<line x1="{f.x(v):.1f}" y1="{TOP}" x2="{f.x(v):.1f}" y2="{H - BOTTOM}" stroke="#555" '
                    'stroke-dasharray="4 3"/>')
    for i, (name, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        if points:
            body += [f'<circle cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="1.6" fill="{color}" fill-opacity="0.6">'
                     f"<title>{escape(name)}</title></circle>" for x, y in pts]
        elif pts:
            coords = []
            for j, (x, y) in enumerate(pts):
                if step and j:
                    coords.append(f"{f.x(x):.1f},{f.y(pts[j - 1][1]):.1f}")
                coords.append(f"{f.x(x):.1f},{f.y(y):.1f}")
            body.append(f'<polyline points="{" ".join(coords)}" fill="none" stroke="{color}" stroke-width="1.6"/>')
            if len(pts) <= 12:
                body += [f'<circle cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="3" fill="{color}"/>' for x, y in pts]
    body += _legend(list(series))
    return _svg(body)


def bar_chart(title: str, bars: dict[str, float | None], ylabel: str) -> str:
    values = [v for v in bars.values() if v is not None]
    f = _Frame([0.0, 1.0], values + [0.0, 1.12 * max(values, default=0.0)])  # headroom for the labels
    body = f.axes(title, "", ylabel)[:1]  # title only: bars have their own x labels
    for t in f.yt:
        y = f.y(t)
        body.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        body.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    body.append(f'<text transform="translate(14 {(TOP + H - BOTTOM) / 2:.0f}) rotate(-90)" '
                f'text-anchor="middle">{escape(ylabel)}</text>')
    n = max(len(bars), 1)
    slot = (W - LEFT - RIGHT) / n
    for i, (name, v) in enumerate(bars.items()):
        x = LEFT + slot * i + slot * 0.15
        label_x = LEFT + slot * (i + 0.5)
        if v is not None:
            y = f.y(v)
            body.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{f.y(0) - y:.1f}" '
                        f'fill="{COLORS[i % len(COLORS)]}"/>')
            body.append(f'<text x="{label_x:.1f}" y="{y - 4:.1f}" text-anchor="middle">{_fmt(v)}</text>')
        body.append(f'<text x="{label_x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{escape(name)}</text>')
    body.append(f'<line x1="{LEFT}" y1="{f.y(0):.1f}" x2="{W - RIGHT}" y2="{f.y(0):.1f}" stroke="#999"/>')
    return _svg(body)
