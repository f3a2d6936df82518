"""The glyphs world's data: prompt sets and a seeded renderer of small grayscale glyph images.

Prompts are short strings over `CHARSET`; `render` draws them with Pillow's bundled font into
`SIZE`x`SIZE` images with random position, size and stroke jitter and a light blur, scaled to
[-1, 1]. Everything is generated on the fly from a seed; nothing is downloaded.
"""

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter, ImageFont

ASSETS = Path(__file__).resolve().parent / "assets"  # the shipped models of the world
CHARSET = "0123456789"
SIZE = 32

PROMPT_SETS = {
    "digits": list(CHARSET),
    "pairs": [a + b for a in CHARSET for b in CHARSET],
}


@lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def render_one(text: str, rng: np.random.Generator) -> np.ndarray:
    """One text as a (SIZE, SIZE) uint8 image: white glyphs, centred with +-2 px jitter."""
    size = int(rng.integers(22, 27)) if len(text) == 1 else int(rng.integers(15, 19))
    stroke = int(rng.integers(0, 2))
    font = _font(size)
    x0, y0, x1, y1 = font.getbbox(text, stroke_width=stroke)
    dx, dy = rng.integers(-2, 3, size=2)
    x = (SIZE - (x1 - x0)) / 2 - x0 + dx
    y = (SIZE - (y1 - y0)) / 2 - y0 + dy
    image = Image.new("L", (SIZE, SIZE), 0)
    ImageDraw.Draw(image).text((x, y), text, fill=255, font=font, stroke_width=stroke, stroke_fill=255)
    return np.asarray(image.filter(ImageFilter.GaussianBlur(0.6)))


def render(texts: list[str], seed: int) -> torch.Tensor:
    """Render texts into a float tensor of shape (B, 1, SIZE, SIZE) in [-1, 1], seeded."""
    rng = np.random.default_rng(seed)
    pixels = np.stack([render_one(t, rng) for t in texts])
    return torch.from_numpy(pixels).float().div(127.5).sub(1.0).unsqueeze(1)
