"""What every diagram of the course is drawn with: its colours, a labelled box, a bare axis."""

from __future__ import annotations

import matplotlib.patches
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgba

from course_lib.plots import STYLE

COLORS = STYLE["axes.prop_cycle"].by_key()["color"]
NODE_COLORS = plt.get_cmap("tab10")  # up to 10 nodes told apart (then the colours repeat)


def box(ax, x, y, w, h, text, color, *, fontsize=8):
    ax.add_patch(matplotlib.patches.FancyBboxPatch(
        (x, y), w, h, boxstyle="round,pad=0.02", facecolor=to_rgba(color, 0.35),
        edgecolor=color, linewidth=1.2))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def blank(ax):
    ax.set_axis_off()
    ax.set_aspect("auto")
