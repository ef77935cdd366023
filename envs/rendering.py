"""Render helpers shared by the ctrlsim envs: the "rgb_array" frame of a text render, and
whether an env's render mode is one it supports (`checks.check_render_mode` warns about others).

Every env renders text ("ansi"); "rgb_array" draws that text into an RGB image, so clients
that ask for frames (SB3's `make_vec_env`, video recorders) get one. The image is drawn with
matplotlib's Agg canvas on a bare `Figure` (no pyplot, no global state), imported only when a
frame is drawn, so building or stepping an env never loads matplotlib.
"""
from __future__ import annotations

from typing import Any

import numpy as np

#: Frame geometry: a fixed width, and a height fixed per env (`rows` text lines), so every frame of
#: an env has the same shape (what video recorders need).
FRAME_WIDTH_PX = 640
ROW_HEIGHT_PX = 20
MARGIN_PX = 10
DPI = 100
MAX_COLUMNS = 88  # characters per line; longer lines are cut with "..."
BACKGROUND = "#ffffff"
HEADER_COLOUR = "#1f3b73"
LINE_COLOURS = {"search": "#b35900", "default": "#202020"}


def text_frame(text: str, rows: int, *, search: bool = False) -> np.ndarray:
    """An (H, W, 3) uint8 image of `text`, H fixed by `rows`: the first line (the header) in blue,
    the others dark grey, or orange when `search` (the slate is search results). Lines past `rows`
    are left out; a line longer than `MAX_COLUMNS` characters is cut."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = max(int(rows), 1)
    lines = text.splitlines() or [""]
    height = 2 * MARGIN_PX + rows * ROW_HEIGHT_PX
    figure = Figure(figsize=(FRAME_WIDTH_PX / DPI, height / DPI), dpi=DPI, facecolor=BACKGROUND)
    canvas = FigureCanvasAgg(figure)
    body = LINE_COLOURS["search" if search else "default"]
    for n, line in enumerate(lines[:rows]):
        if len(line) > MAX_COLUMNS:
            line = line[: MAX_COLUMNS - 3] + "..."
        y = 1.0 - (MARGIN_PX + (n + 0.5) * ROW_HEIGHT_PX) / height
        figure.text(MARGIN_PX / FRAME_WIDTH_PX, y, line, family="monospace", fontsize=9, va="center",
                    ha="left", color=HEADER_COLOUR if n == 0 else body,
                    fontweight="bold" if n == 0 else "normal")
    canvas.draw()
    frame = np.asarray(canvas.buffer_rgba())[..., :3]
    return np.ascontiguousarray(frame, dtype=np.uint8)


def supported(env: Any) -> bool:
    """Whether `env.render_mode` is one `env` can render (declared in its metadata)."""
    return env.render_mode is not None and env.render_mode in env.metadata.get("render_modes", ())
