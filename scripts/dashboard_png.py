"""Render docs/dashboard.png: the routing and timeline views of the first specter window on the bundled model
(the README's quickstart settings), stacked into one static image.

    python scripts/dashboard_png.py [--out docs/dashboard.png]

Needs kaleido with a Chromium on the PATH (Debian: apt install chromium) and Pillow (pip install pillow).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/dashboard.png")
    a = ap.parse_args()
    from PIL import Image

    import specter_lab as sl
    from specter_lab.atomic import atomic_open
    from specter_lab.viz import figures as F

    torch.set_num_threads(1)
    model, tok = sl.load_model("tiny")
    r = sl.Engine(model, tok, "specter", expert_budget=0.5, hardware="rtx4090-pcie4",
                  cost_shape="deepseek-v2-lite").generate("def fib(n):", max_new_tokens=48)
    step = F.default_routing_step(r.frames())
    with tempfile.TemporaryDirectory() as tmp:
        parts = []
        for name, fig in (("routing", F.routing_figure(r, step)), ("timeline", F.timeline_figure(r, step))):
            path = Path(tmp) / f"{name}.png"
            fig.write_image(path, width=900, height=330, scale=1)
            parts.append(Image.open(path).convert("RGB"))
        out = Image.new("RGB", (max(p.width for p in parts), sum(p.height for p in parts)), "white")
        y = 0
        for p in parts:
            out.paste(p, (0, y))
            y += p.height
        with atomic_open(a.out, "wb") as f:  # the old picture stays until the new one is whole
            out.save(f, format="PNG", optimize=True)
    print(f"step {step}: wrote {a.out} ({out.width}x{out.height})")


if __name__ == "__main__":
    main()
