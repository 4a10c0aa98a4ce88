"""Matplotlib and HTML helpers shared by ``fedray report``/``compare``, the methods' report
sections and the jobs' plots, so every figure explains itself the same way:

- axis labels name the unit and which way is better (:func:`axis_label`, :data:`UP`);
- the chance level is drawn as a dashed grey line (:func:`chance_line`);
- several seeds are shown as mean ± sd error bars (:func:`mean_sd`, :func:`error_bars`);
- :func:`save_figure` writes a figure and returns what it shows (titles, labels, chance
  levels, error bars), read back from the figure itself, so callers and tests can check a
  plot without looking at pixels;
- :func:`markdown_html` turns a report's Markdown into one self-contained HTML page: its
  tables, and its PNGs inlined as base64 ``data:`` URIs (no network, no scripts), so a run can
  be shared as one file.

The backend is the headless Agg one.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from collections.abc import Iterable
from typing import Any

UP = "↑ better"
DOWN = "↓ better"
FRACTION = "fraction correct"  # the unit of every accuracy fedray reports


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out_dir: str, name: str, dpi: int = 120) -> str:
    """Lay out (tight, unless the figure was made with a layout engine of its own, e.g.
    ``layout="constrained"`` for colour bars), write ``out_dir/name`` and close a figure;
    returns the path."""
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:
        fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def heatmap(values: Any, rows: list[str], cols: list[str], colorbar: str,
            fontsize: float = 7) -> tuple[Any, Any]:
    """A (rows × cols) grid of values in [0, 1] on a viridis scale, each cell annotated
    with its value (empty for NaN), the colour bar labelled ``colorbar``: (figure, axes)."""
    import numpy as np

    grid = np.asarray(values, dtype=float)
    lines = max((t.count("\n") + 1 for t in rows), default=1)
    fig, ax = pyplot().subplots(figsize=(1.3 * len(cols) + 5,
                                         (0.3 + 0.2 * lines) * len(rows) + 3))
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=fontsize)
    ax.set_yticks(range(len(rows)), rows, fontsize=fontsize)
    for i, j in np.ndindex(grid.shape):
        if not math.isnan(grid[i, j]):
            ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if grid[i, j] < 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.04, label=colorbar)
    return fig, ax


def save_figure(fig: Any, out_dir: str, name: str, dpi: int = 120) -> dict[str, Any]:
    """:func:`save`, returning :func:`describe` of the figure plus its ``path``."""
    info = describe(fig)
    return {"path": save(fig, out_dir, name, dpi), **info}


def images(paths: list[str], out_dir: str) -> str:
    """Markdown image links to ``paths``, relative to the Markdown file's folder."""
    return "".join(f"![{os.path.basename(p)}]({os.path.relpath(p, out_dir)})\n"
                   for p in paths)


# ----------------------------------------------------------------------------- labels


def axis_label(what: str, unit: str | None = None, better: str | None = None) -> str:
    """``what (unit, ↑ better)``: an axis label with its unit and the good direction."""
    extra = [p for p in (unit, better) if p]
    return f"{what} ({', '.join(extra)})" if extra else what


def chance_line(ax: Any, level: float | None, what: str = "chance") -> None:
    """A dashed grey horizontal line at ``level`` labelled with its value (nothing for None:
    a metric without a meaningful chance level). Tagged ``gid="chance"`` for
    :func:`describe`."""
    if level is None or not math.isfinite(level):
        return
    ax.axhline(level, color="grey", ls="--", lw=1, gid="chance",
               label=f"{what} = {level:.3g}")


def mean_sd(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation (ddof 1; None for fewer than two values) and count of
    the finite ``values`` (None and NaN dropped); (None, None, 0) when none is left."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return None, None, 0
    mean = sum(v) / len(v)
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
    return mean, sd, len(v)


def error_bars(ax: Any, x: Any, mean: Any, sd: Any, label: str, **kw: Any) -> Any:
    """``mean`` with ± ``sd`` error bars at each ``x`` (a line plot when ``x`` has several
    points, bars and caps either way); returns the matplotlib container."""
    kw.setdefault("marker", ".")
    return ax.errorbar(x, mean, yerr=sd, capsize=3, label=label, **kw)


def describe(fig: Any) -> dict[str, Any]:
    """What a figure shows, read from the figure: its title and, per plotting axes, the
    title, axis labels, the chance levels drawn (:func:`chance_line`) and how many series
    carry error bars."""
    from matplotlib.container import ErrorbarContainer

    axes = []
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.has_yerr]
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(),
                     "ylabel": ax.get_ylabel(),
                     "chance": [float(line.get_ydata()[0]) for line in ax.lines
                                if line.get_gid() == "chance"],
                     "error_bars": len(bars)})
    return {"title": fig.get_suptitle(), "axes": axes}


# ----------------------------------------------------------------------------- HTML

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; }
img { max-width: 100%; height: auto; }
figcaption { font-size: 0.8em; color: #666; }
"""


def png_data_uri(path: str) -> str:
    """The PNG file ``path`` as a ``data:image/png;base64,...`` URI."""
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


def html_page(title: str, body: str) -> str:
    """A complete HTML5 document: ``title`` (escaped here) around ``body`` (already HTML),
    with its style inline and nothing fetched from anywhere."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
            f"<body>\n{body}</body>\n</html>\n")


_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")
_BULLET = re.compile(r"^[-*] (.*)$")
_HEADING = re.compile(r"^(#{1,6}) (.*)$")


def markdown_html(text: str, base_dir: str, title: str | None = None) -> str:
    """A self-contained HTML page from the Markdown fedray's reports write: ``#`` headings,
    pipe tables, ``-`` lists, image lines and paragraphs (anything else is kept as escaped
    text). Each image line that names a local PNG (relative to ``base_dir``) is inlined as
    base64; any other image is shown by its name only, so the page never refers to a file
    or URL. The page title is ``title`` or the first heading."""
    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line:
            i += 1
        elif m := _HEADING.match(line):
            level = len(m.group(1))
            title = title or m.group(2)
            blocks.append(f"<h{level}>{html.escape(m.group(2))}</h{level}>")
            i += 1
        elif m := _IMAGE.match(line):
            blocks.append(_figure(m.group(1), m.group(2), base_dir))
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(lines[i].strip())
                i += 1
            blocks.append(_table(rows))
        elif _BULLET.match(line):
            items = []
            while i < len(lines) and (m := _BULLET.match(lines[i].strip())):
                items.append(f"<li>{html.escape(m.group(1))}</li>")
                i += 1
            blocks.append("<ul>\n" + "\n".join(items) + "\n</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not _starts_block(lines[i].strip()):
                para.append(lines[i].strip())
                i += 1
            blocks.append(f"<p>{html.escape(' '.join(para))}</p>")
    return html_page(title or "fedray report", "\n".join(blocks) + "\n")


def _starts_block(line: str) -> bool:
    return bool(_HEADING.match(line) or _IMAGE.match(line) or _BULLET.match(line)
                or line.startswith("|"))


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _table(rows: list[str]) -> str:
    """A Markdown pipe table (header, ``---`` rule, body) as an HTML table."""
    head, body = _cells(rows[0]), rows[1:]
    if body and set(body[0].replace("|", "").replace(":", "").strip()) <= {"-", " "}:
        body = body[1:]
    out = ["<table>", "<thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head)
           + "</tr></thead>", "<tbody>"]
    out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>"
            for r in body]
    return "\n".join(out + ["</tbody>", "</table>"])


def _figure(alt: str, src: str, base_dir: str) -> str:
    """An image line as a figure: the PNG inlined only when ``src`` is a relative name of a
    file inside ``base_dir`` (the report's own plots), so a page never carries another
    file's bytes, whatever a run's stored name put into the Markdown."""
    from fedray.core.outputs import resolves_inside

    path = os.path.join(base_dir, src)
    caption = f"<figcaption>{html.escape(alt)}</figcaption>"
    if "://" in src or os.path.isabs(src) or not src.lower().endswith(".png") or \
            not resolves_inside(path, base_dir) or not os.path.isfile(path):
        return f"<figure>{caption}</figure>"
    return (f"<figure><img src=\"{png_data_uri(path)}\" alt=\"{html.escape(alt)}\">"
            f"{caption}</figure>")
