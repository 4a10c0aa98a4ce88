"""Matplotlib helpers shared by ``fedray report`` and the methods' report sections (headless
backend; one way to lay out, write and close a figure)."""

from __future__ import annotations

import os
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out_dir: str, name: str, dpi: int = 120) -> str:
    """Lay out, write ``out_dir/name`` and close a figure; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def images(paths: list[str], out_dir: str) -> str:
    """Markdown image links to ``paths``, relative to the Markdown file's folder."""
    return "".join(f"![{os.path.basename(p)}]({os.path.relpath(p, out_dir)})\n"
                   for p in paths)
