"""Headless Chromium screenshots of an HTML report, and the check that its plots were drawn.

The report template frames each figure in one exact colour (FRAME, see
monitor/reports/templates/report.html.j2), so the figures can be found in the screenshot
and each checked to hold a drawn plot rather than a broken or blank image.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

FRAME = (17, 85, 204)


def chromium_screenshot(page: Path, shot: Path, profile: Path, *, size: str = "1200,3000") -> Path:
    """Render `page` in headless Chromium and write a PNG screenshot to `shot`."""
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                    f"--screenshot={shot}", f"--window-size={size}", Path(page).as_uri()],
                   check=True, capture_output=True, timeout=120)
    return shot


def plot_frames(png: Path) -> list[tuple[int, int, int, int]]:
    """Bounding boxes (top, left, bottom, right) of the figure frames in a screenshot."""
    from PIL import Image
    from scipy import ndimage

    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    mask = np.all(np.abs(pixels - np.array(FRAME)) <= 2, axis=2)
    labelled, _ = ndimage.label(mask)
    boxes = []
    for sl in ndimage.find_objects(labelled):
        h, w = sl[0].stop - sl[0].start, sl[1].stop - sl[1].start
        if h > 100 and w > 100:
            boxes.append((sl[0].start, sl[1].start, sl[0].stop, sl[1].stop))
    return sorted(boxes)


def drawn_plots(png: Path) -> list[tuple[float, int]]:
    """For each framed figure of a screenshot: (share of non-white pixels, distinct colours).

    Raises AssertionError when a frame does not hold the full 800x400 figure."""
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    found = []
    for top, left, bottom, right in plot_frames(png):
        inner = pixels[top + 6:bottom - 6, left + 6:right - 6]
        assert inner.shape[0] > 300 and inner.shape[1] > 700, inner.shape   # the figure, inside its frame
        found.append((float(np.any(inner < 240, axis=2).mean()), len(np.unique(inner.reshape(-1, 3), axis=0))))
    return found


__all__ = ["FRAME", "chromium_screenshot", "plot_frames", "drawn_plots"]
