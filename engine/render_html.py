"""Inline SVG pictures for the HTML report: no scripts, no fonts, no network, printable.

Each function returns a complete `<svg>` element as a string (labels escaped); the page layout is
the jinja2 template `templates/report.html.j2`.
"""

from __future__ import annotations

from html import escape

from eroica.schema.diagnosis import Heatmap, SignalComparison, StepSummary, WindowDiagnosis

RED, BLUE, GREY, INK, FAINT = "#c0392b", "#2e6fb7", "#b8bec6", "#1d232b", "#eef1f4"
MAX_BARS = 512              # per-rank bars beyond this are binned (the maximum of each bin)
_NOISE = ("autograd::engine::evaluate_function: ", "torch::autograd::", "torch.distributed.ddp.reducer::")


def short(name: str, n: int = 34) -> str:
    cat, _, fn = name.partition(":")
    for p in _NOISE:
        fn = fn.replace(p, "")
    fn = fn or cat
    return fn if len(fn) <= n else fn[: n - 1] + "…"


def _color(x: float, scale: float) -> str:
    """Diverging: red = more time than the peer median, blue = less, white = the same."""
    t = max(-1.0, min(1.0, x / scale)) if scale > 0 else 0.0
    base = (192, 57, 43) if t > 0 else (46, 111, 183)
    a = abs(t) ** 0.7
    r, g, b = (round(255 + (c - 255) * a) for c in base)
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap_svg(hm: Heatmap) -> str:
    cell_w, cell_h, left, top = 64, 20, 150, 150
    cols, rows = hm.functions, hm.rows
    width, height = left + cell_w * len(cols) + 10, top + cell_h * len(rows) + 26
    scale = max((abs(v) for r in rows for v in r.values_seconds), default=0.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="rank by function deviation heatmap">']
    for j, name in enumerate(cols):
        x = left + j * cell_w + cell_w / 2
        out.append(f'<text x="{x:.0f}" y="{top - 6}" transform="rotate(-40 {x:.0f} {top - 6})" '
                   f'font-size="11" fill="{INK}">{escape(short(name, 26))}<title>{escape(name)}</title></text>')
    for i, row in enumerate(rows):
        y = top + i * cell_h
        weight = "bold" if i == 0 and row.busy_excess_seconds > 0 else "normal"
        out.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end" font-size="12" font-weight="{weight}" '
                   f'fill="{INK}">{escape(row.label)}</text>')
        for j, v in enumerate(row.values_seconds):
            x = left + j * cell_w
            tip = f"{row.label} · {cols[j]}: {v * 1000:+.1f} ms/step vs the peer median"
            out.append(f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="{_color(v, scale)}">'
                       f'<title>{escape(tip)}</title></rect>')
            if abs(v) >= 0.25 * scale and scale > 0:
                fill = "#fff" if abs(v) >= 0.6 * scale else INK
                out.append(f'<text x="{x + cell_w / 2 - 1:.0f}" y="{y + 14}" text-anchor="middle" font-size="10" '
                           f'fill="{fill}">{v * 1000:+.0f}</text>')
    y = top + len(rows) * cell_h + 18
    out.append(f'<text x="{left}" y="{y}" font-size="11" fill="#555">ms/step against the peer median: red = more '
               f'time than the peers (culprit), blue = less; communication is red on ranks that wait.</text>')
    out.append("</svg>")
    return "".join(out)


def _bins(values: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    if len(values) <= MAX_BARS:
        return values
    k = -(-len(values) // MAX_BARS)
    out = []
    for i in range(0, len(values), k):
        chunk = values[i:i + k]
        best = max(chunk, key=lambda v: v[1])
        out.append((f"{chunk[0][0]}–{chunk[-1][0]}", best[1], best[2]))
    return out


def rank_steps_svg(steps: StepSummary, before: dict[str, float], culprits: set[int]) -> str:
    """Per rank: busy (dark; red for a culprit) + communication wait (light) during the window, and
    a tick at the rank's step time before the window."""
    ranks = sorted(steps.per_rank_busy_seconds, key=int)
    vals = _bins([(r, steps.per_rank_busy_seconds[r], steps.per_rank_comm_wait_seconds.get(r, 0.0)) for r in ranks])
    top_v = max([b + c for _, b, c in vals] + list(before.values()) + [1e-9])
    h, left, bottom = 160, 46, 30
    bw = max(2.0, min(36.0, 720 / max(len(vals), 1)))
    width = left + bw * len(vals) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{h + bottom + 10}" '
           f'role="img" aria-label="per-rank step time">']
    for frac in (0.0, 0.5, 1.0):
        y = 10 + h - h * frac
        out.append(f'<line x1="{left}" x2="{width - 10:.0f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{FAINT}"/>'
                   f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10" fill="#555">'
                   f'{top_v * frac * 1000:.0f}</text>')
    for i, (r, busy, comm) in enumerate(vals):
        x = left + i * bw
        hb, hc = h * busy / top_v, h * comm / top_v
        culprit = r.isdigit() and int(r) in culprits
        tip = f"rank {r}: busy {busy * 1000:.1f} ms, waiting in communication {comm * 1000:.1f} ms per step"
        out.append(f'<rect x="{x:.1f}" y="{10 + h - hb:.1f}" width="{bw - 1:.1f}" height="{hb:.1f}" '
                   f'fill="{RED if culprit else INK}"><title>{escape(tip)}</title></rect>')
        out.append(f'<rect x="{x:.1f}" y="{10 + h - hb - hc:.1f}" width="{bw - 1:.1f}" height="{hc:.1f}" '
                   f'fill="{GREY}"><title>{escape(tip)}</title></rect>')
        if r in before:
            yb = 10 + h - h * before[r] / top_v
            out.append(f'<line x1="{x:.1f}" x2="{x + bw - 1:.1f}" y1="{yb:.1f}" y2="{yb:.1f}" stroke="{BLUE}" '
                       f'stroke-width="2"><title>rank {escape(r)} before the window: '
                       f'{before[r] * 1000:.1f} ms/step</title></line>')
        if len(vals) <= 64:
            out.append(f'<text x="{x + bw / 2:.1f}" y="{h + 24}" text-anchor="middle" font-size="10" '
                       f'fill="{INK}">{escape(r)}</text>')
    out.append("</svg>")
    return "".join(out)


def series_svg(before: list[float], during: list[float]) -> str:
    pts = before + during
    if not pts:
        return ""
    h, w, left = 120, 640, 46
    # a one-off spike would flatten every other step: the axis stops at 4x the median step and
    # a clipped point is drawn at the top, its value in its tooltip
    med = sorted(pts)[len(pts) // 2]
    top_v = min(max(pts), 4 * med if med > 0 else max(pts)) * 1.1 or 1.0
    dx = (w - left - 10) / max(len(pts) - 1, 1)
    xy = [(left + i * dx, 10 + h - h * min(v, top_v) / top_v) for i, v in enumerate(pts)]
    x0 = left + len(before) * dx - dx / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h + 34}" class="fluid" role="img" '
           f'aria-label="job step time before and during the window">',
           f'<rect x="{x0:.1f}" y="10" width="{w - 10 - x0:.1f}" height="{h}" fill="#fbeeee"/>',
           f'<text x="{w - 14}" y="22" text-anchor="end" font-size="10" fill="{RED}">window</text>']
    for frac in (0.0, 0.5, 1.0):
        y = 10 + h - h * frac
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10" fill="#555">'
                   f'{top_v * frac * 1000:.0f}</text>')
    path = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(xy))
    out.append(f'<path d="{path}" fill="none" stroke="{INK}" stroke-width="1.5"/>')
    for (x, y), v in zip(xy, pts):
        clipped = v > top_v
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{3.5 if clipped else 2.2}" '
                   f'fill="{RED if clipped else INK}"><title>{v * 1000:.1f} ms</title></circle>')
        if clipped:
            out.append(f'<text x="{x + 5:.1f}" y="{y + 10:.1f}" font-size="10" fill="{RED}">{v:.1f} s</text>')
    out.append(f'<text x="{left}" y="{h + 30}" font-size="10" fill="#555">ms per step (median over ranks): '
               f'{len(before)} steps before the window, {len(during)} in it</text></svg>')
    return "".join(out)


def signals_svg(signals: list[SignalComparison]) -> str:
    """Each signal on its own scale: the peers' 10th-90th percentile band, their median tick, and
    the culprit's value (red dot)."""
    if not signals:
        return ""
    row_h, left, w, label_w = 26, 290, 800, 170
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {row_h * len(signals) + 10}" class="fluid" '
           f'role="img" aria-label="hardware signature beside the peers">']
    for i, s in enumerate(signals):
        y = 8 + i * row_h
        lo = min(s.value, s.peer_p10, s.peer_median)
        hi = max(s.value, s.peer_p90, s.peer_median)
        span = (hi - lo) or max(abs(hi), 1e-9)
        lo, span = lo - 0.08 * span, span * 1.16

        def x(v: float, lo: float = lo, span: float = span) -> float:
            return left + (w - left - label_w - 10) * (v - lo) / span

        label = s.signal
        for p in _NOISE:
            label = label.replace(p, "")
        label = label if len(label) <= 44 else label[:43] + "…"
        out.append(f'<text x="{left - 8}" y="{y + 12}" text-anchor="end" font-size="11" fill="{INK}">'
                   f'{escape(label)}<title>{escape(s.signal)}</title></text>')
        out.append(f'<line x1="{left}" x2="{w - label_w - 10}" y1="{y + 8}" y2="{y + 8}" stroke="{FAINT}" '
                   f'stroke-width="6"/>')
        out.append(f'<line x1="{x(s.peer_p10):.1f}" x2="{x(s.peer_p90):.1f}" y1="{y + 8}" y2="{y + 8}" '
                   f'stroke="{GREY}" stroke-width="6"><title>peers 10th-90th percentile: {s.peer_p10:.4g} - '
                   f'{s.peer_p90:.4g}</title></line>')
        out.append(f'<line x1="{x(s.peer_median):.1f}" x2="{x(s.peer_median):.1f}" y1="{y + 1}" y2="{y + 15}" '
                   f'stroke="{INK}" stroke-width="2"><title>peer median {s.peer_median:.4g}</title></line>')
        out.append(f'<circle cx="{x(s.value):.1f}" cy="{y + 8}" r="5" fill="{RED}"><title>this rank: '
                   f'{s.value:.4g}</title></circle>')
        out.append(f'<text x="{w - label_w}" y="{y + 12}" font-size="11" fill="{INK}">{s.value:.4g} '
                   f'(peers {s.peer_median:.4g})</text>')
    out.append("</svg>")
    return "".join(out)


def window_pictures(w: WindowDiagnosis) -> dict[str, str]:
    culprits = {r for f in w.findings if f.confidence >= 0.5 for r in f.ranks}
    before = w.step_series.per_rank_before_seconds if w.step_series else {}
    return {
        "heatmap": heatmap_svg(w.heatmap) if w.heatmap and w.heatmap.functions else "",
        "ranks": rank_steps_svg(w.steps, before, culprits) if w.steps.per_rank_busy_seconds else "",
        "series": series_svg(w.step_series.before_seconds, w.step_series.during_seconds) if w.step_series else "",
        "signals": signals_svg(w.findings[0].signals) if w.findings else "",
    }
