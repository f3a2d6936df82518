"""The glyphs world's data: prompt sets, a seeded renderer of small grayscale glyph images, the
augmentations and the hard negatives its recognizers learn from.

Prompts are short strings over `CHARSET`; `render` draws them with Pillow's bundled font into
`SIZE`x`SIZE` images with random size, stroke and position and a light blur, scaled to [-1, 1].
The renderer has finitely many outcomes per text (`variants` lists them all), so pretraining draws
from those banks instead of calling Pillow at every step. `augment` distorts images strongly
(affine, elastic, thickness, blur, contrast, noise, faint textures) and `negatives` draws images
that are not digits (blobs, ovals with dots, textures, superposed digits, noise). Everything is
generated from a seed; nothing is downloaded.
"""

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFilter, ImageFont

ASSETS = Path(__file__).resolve().parent / "assets"  # the shipped models of the world
CHARSET = "0123456789"
SIZE = 32

FRAMES = 4  # frames of a glyphs video

PROMPT_SETS = {
    "digits": list(CHARSET),
    "pairs": [a + b for a in CHARSET for b in CHARSET],
}


@lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _sizes(text: str) -> range:
    return range(22, 27) if len(text) == 1 else range(15, 19)


def draw(text: str, size: int, stroke: int, dx: int, dy: int) -> np.ndarray:
    """One text as a (SIZE, SIZE) uint8 image: white glyphs of font `size`, centred, moved by (dx, dy)."""
    font = _font(size)
    x0, y0, x1, y1 = font.getbbox(text, stroke_width=stroke)
    x = (SIZE - (x1 - x0)) / 2 - x0 + dx
    y = (SIZE - (y1 - y0)) / 2 - y0 + dy
    image = Image.new("L", (SIZE, SIZE), 0)
    ImageDraw.Draw(image).text((x, y), text, fill=255, font=font, stroke_width=stroke, stroke_fill=255)
    return np.asarray(image.filter(ImageFilter.GaussianBlur(0.6)))


def render_one(text: str, rng: np.random.Generator) -> np.ndarray:
    """One text as a (SIZE, SIZE) uint8 image with a random size, stroke (0 or 1) and +-2 px offset."""
    sizes = _sizes(text)
    size = int(rng.integers(sizes.start, sizes.stop))
    stroke = int(rng.integers(0, 2))
    dx, dy = rng.integers(-2, 3, size=2)
    return draw(text, size, stroke, int(dx), int(dy))


def render(texts: list[str], seed: int) -> torch.Tensor:
    """Render texts into a float tensor of shape (B, 1, SIZE, SIZE) in [-1, 1], seeded."""
    rng = np.random.default_rng(seed)
    pixels = np.stack([render_one(t, rng) for t in texts])
    return torch.from_numpy(pixels).float().div(127.5).sub(1.0).unsqueeze(1)


@lru_cache(maxsize=256)
def variants(text: str) -> torch.Tensor:
    """Every image `render` can draw for `text`, equally likely: (V, 1, SIZE, SIZE) in [-1, 1]."""
    pixels = [
        draw(text, s, k, dx, dy) for s in _sizes(text) for k in (0, 1) for dx in range(-2, 3) for dy in range(-2, 3)
    ]
    return torch.from_numpy(np.stack(pixels)).float().div(127.5).sub(1.0).unsqueeze(1)


@lru_cache(maxsize=8)
def _bank(texts: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [variants(t) for t in texts]
    return torch.cat(parts), torch.cat([torch.full((len(p),), i) for i, p in enumerate(parts)])


def bank(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The variants of several texts stacked, (N, 1, SIZE, SIZE), and each image's text index (N,)."""
    return _bank(tuple(texts))


def _uniform(n: int, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g)


def blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Gaussian blur of each image (B, 1, H, W) with its own sigma (B,) in pixels (0: unchanged)."""
    r = torch.arange(-3, 4, dtype=x.dtype, device=x.device)
    k = torch.exp(-(r**2) / (2 * sigma.to(x).clamp_min(1e-3)[:, None] ** 2))
    k = (k / k.sum(1, keepdim=True)).view(len(x), 1, 1, 7)
    out = F.conv2d(x.transpose(0, 1), k, padding=(0, 3), groups=len(x))
    out = F.conv2d(out, k.transpose(2, 3), padding=(3, 0), groups=len(x))
    return out.transpose(0, 1)


def textures(n: int, g: torch.Generator) -> torch.Tensor:
    """Texture-only images (n, 1, SIZE, SIZE) in [0, 1]: checkerboards, stripes, dot grids, noise."""
    i = torch.arange(SIZE).view(1, SIZE, 1)
    j = torch.arange(SIZE).view(1, 1, SIZE)
    kind, period, phase = torch.randint(0, 10, (3, n, 1, 1), generator=g)
    period = 2 + period % 4
    checker = ((i + phase) // period + (j + phase) // period) % 2
    stripes = torch.where(kind == 2, i + phase, j + phase) // period % 2
    dots = ((i + phase) % period == 0) & ((j + phase) % period == 0)  # the dot grid RL painted into backgrounds
    noise = torch.rand(n, SIZE, SIZE, generator=g) ** (1 + period)
    pattern = torch.where(kind < 2, checker, torch.where(kind < 4, stripes, torch.where(kind < 7, dots, noise)))
    return pattern.float().unsqueeze(1)


def augment(images: torch.Tensor, g: torch.Generator, strength: float = 1.0) -> torch.Tensor:
    """Strongly distorted copies of glyph images (B, 1, SIZE, SIZE) in [-1, 1]: a random affine map
    (rotation, scale, aspect, shear, shift), an elastic warp, thicker or thinner strokes, blur,
    lower contrast, a faint texture and pixel noise. `strength` scales every distortion."""
    n, s, device = len(images), strength, images.device
    x = (images.float() + 1) / 2
    angle = _uniform(n, -12, 12, g) * s * math.pi / 180
    scale = 1 + _uniform(n, -0.22, 0.18, g) * s
    aspect = 1 + _uniform(n, -0.15, 0.15, g) * s
    shear = _uniform(n, -0.2, 0.2, g) * s
    shift = (torch.rand(n, 2, generator=g) * 2 - 1) * 0.25 * s  # +-4 px
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([torch.stack([cos / (scale * aspect), (-sin + shear) / scale, shift[:, 0]], 1),
                         torch.stack([sin / scale, cos * aspect / scale, shift[:, 1]], 1)], 1)  # fmt: skip
    grid = F.affine_grid(theta.to(device), list(x.shape), align_corners=False)
    warp = (torch.randn(n, 2, 4, 4, generator=g) * _uniform(n, 0, 0.05, g).view(n, 1, 1, 1) * s).to(device)
    grid = grid + F.interpolate(warp, size=(SIZE, SIZE), mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
    x = F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)
    thick = _uniform(n, -0.7, 1.0, g).view(n, 1, 1, 1).to(device) * s
    grown, thinned = F.max_pool2d(x, 3, 1, 1), -F.max_pool2d(-x, 3, 1, 1)
    x = torch.where(thick > 0, torch.lerp(x, grown, thick.clamp_min(0)), torch.lerp(x, thinned, (-thick).clamp_min(0)))
    x = blur(x, _uniform(n, 0, 1.0, g) * s)
    x = x * (1 - _uniform(n, 0, 0.45, g) * s).view(n, 1, 1, 1).to(device)
    faint = (torch.rand(n, generator=g) < 0.25).float() * _uniform(n, 0, 0.25, g) * s
    x = x + (faint.view(n, 1, 1, 1) * textures(n, g)).to(device)
    noisy = (torch.rand(n, generator=g) < 0.5).float() * _uniform(n, 0, 0.15, g) * s
    x = x + (noisy.view(n, 1, 1, 1) * torch.randn(x.shape, generator=g)).to(device)
    return x.clamp(0, 1) * 2 - 1


def bold_or_hazy(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Legible digits (B, 1, SIZE, SIZE) in [-1, 1] drawn as generators draw them: a quarter one pixel bolder, a
    quarter on a grey haze (background raised by up to 0.2), a quarter with a soft glow around the strokes, a
    quarter one or two pixels bolder with a texture inside the strokes (dimmed by up to half). The gold judge
    learns these as digits, so that it does not call a bold, hazy or grainy but legible digit "not a digit"."""
    n, device = len(images), images.device
    x = (images.float() + 1) / 2
    which = torch.randint(0, 4, (n, 1, 1, 1), generator=g).to(device)
    bold = F.max_pool2d(x, 3, 1, 1)
    haze = _uniform(n, 0.05, 0.2, g).view(n, 1, 1, 1).to(device)
    hazy = haze + (1 - haze) * x
    glow = torch.maximum(x, _uniform(n, 0.2, 0.5, g).view(n, 1, 1, 1).to(device) * blur(x, _uniform(n, 1.5, 2.5, g)))
    bolder = torch.where((torch.rand(n, 1, 1, 1, generator=g) < 0.5).to(device), bold, F.max_pool2d(x, 5, 1, 2))
    grainy = bolder * (1 - _uniform(n, 0.1, 0.5, g).view(n, 1, 1, 1).to(device) * textures(n, g).to(device))
    x = torch.where(which == 0, bold, torch.where(which == 1, hazy, torch.where(which == 2, glow, grainy)))
    return x * 2 - 1


def _ellipses(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalised radius fields (n, SIZE, SIZE) of random ellipses, and their centres and radii."""
    i = torch.arange(SIZE).float().view(1, SIZE, 1)
    j = torch.arange(SIZE).float().view(1, 1, SIZE)
    centre = 16 + (torch.rand(n, 2, generator=g) * 2 - 1) * 3
    radii = torch.stack([_uniform(n, 6, 12, g), _uniform(n, 4, 9, g)], 1)  # (vertical, horizontal)
    r = ((i - centre[:, 0, None, None]) / radii[:, 0, None, None]) ** 2
    r = (r + ((j - centre[:, 1, None, None]) / radii[:, 1, None, None]) ** 2).sqrt()
    return r, centre, radii


def _dots(n: int, centre: torch.Tensor, radii: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Masks (n, SIZE, SIZE) of one to three small discs within each ellipse."""
    i = torch.arange(SIZE).float().view(1, SIZE, 1)
    j = torch.arange(SIZE).float().view(1, 1, SIZE)
    mask = torch.zeros(n, SIZE, SIZE)
    count = torch.randint(1, 4, (n,), generator=g)
    for k in range(3):
        at = centre + (torch.rand(n, 2, generator=g) * 2 - 1) * radii * 0.5
        size = _uniform(n, 1.0, 2.5, g).view(n, 1, 1)
        disc = ((i - at[:, 0, None, None]) ** 2 + (j - at[:, 1, None, None]) ** 2).sqrt() < size
        mask = torch.maximum(mask, disc.float() * (k < count).float().view(n, 1, 1))
    return mask


NEGATIVE_KINDS = ("blob", "oval_dark_dots", "ring_bright_dots", "texture", "textured_blob", "superposed",
                  "swollen", "noised", "empty")  # fmt: skip


def negatives(n: int, g: torch.Generator, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 1, SIZE, SIZE) in [-1, 1] that are not digits, and their kind (n,), an index of
    NEGATIVE_KINDS: smooth blobs, filled ovals with dark dots ("9 as an oval with a dot"), rings
    with bright dots ("6 as a 0 with a dot"), textures, blobs filled with texture, two digits drawn
    over each other, digits swollen into blobs, digits under heavy noise, and empty images. All get
    a mild `augment` (on `device`), so distortion alone never tells a negative from a digit."""
    kind = torch.randint(0, len(NEGATIVE_KINDS), (n,), generator=g)
    coarse = torch.randint(3, 7, (n,), generator=g)
    blobs = torch.zeros(n, SIZE, SIZE)
    for k in range(3, 7):
        low = torch.randn(n, 1, k, k, generator=g)
        blobs += F.interpolate(low, size=(SIZE, SIZE), mode="bicubic", align_corners=False)[:, 0] * (coarse == k).view(
            n, 1, 1
        )
    blobs = torch.sigmoid((blobs - _uniform(n, 0.3, 1.0, g).view(n, 1, 1)) * 6)
    r, centre, radii = _ellipses(n, g)
    dots = _dots(n, centre, radii, g)
    filled = torch.sigmoid((1 - r) * 8)
    ring = torch.sigmoid((_uniform(n, 0.15, 0.3, g).view(n, 1, 1) - (r - 0.85).abs()) * 20)
    digits = torch.randint(0, 10, (n, 2), generator=g)
    digits[:, 1] = (digits[:, 0] + torch.randint(1, 10, (n,), generator=g)) % 10  # two different digits
    drawn = bank(list(CHARSET))[0][:, 0]  # (10 * 250, SIZE, SIZE), digit-major
    first = drawn[digits[:, 0] * 250 + torch.randint(0, 250, (n,), generator=g)]
    second = drawn[digits[:, 1] * 250 + torch.randint(0, 250, (n,), generator=g)]
    move = torch.randint(4, 8, (n,), generator=g) * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)
    columns = (torch.arange(SIZE).view(1, SIZE) - move.view(n, 1)) % SIZE  # rolled sideways by 4-7 px
    second = second.gather(2, columns.view(n, 1, SIZE).expand(n, SIZE, SIZE))
    first, second = (first + 1) / 2, (second + 1) / 2
    swollen = blur(F.max_pool2d(first[:, None], 9, 1, 4), _uniform(n, 1.5, 2.5, g))[:, 0]  # no stroke is left
    sigma = _uniform(n, 0.65, 1.0, g).view(n, 1, 1)
    noised = (1 - sigma) * first + sigma * torch.randn(n, SIZE, SIZE, generator=g).abs()
    texture = textures(n, g)[:, 0]
    by_kind = torch.stack([
        blobs,
        filled * (1 - dots),
        torch.maximum(ring, dots),
        texture,
        torch.maximum(blobs, filled) * texture.clamp_min(0.3),
        torch.maximum(first, second),
        swollen,
        noised,
        torch.rand(n, SIZE, SIZE, generator=g) * _uniform(n, 0, 0.15, g).view(n, 1, 1),
    ], 1)  # fmt: skip
    images = by_kind[torch.arange(n), kind].clamp(0, 1).unsqueeze(1) * 2 - 1
    return augment(images.to(device), g, strength=0.5), kind


# The edit task: a source image shows one digit; the instruction (the prompt) names another digit, to be drawn in
# the same place and at the same size. Sources vary more than text-to-image renders, so that keeping the place is
# a skill: font sizes 18-26 and offsets of up to 4 px, both within what the recognizers learnt under `augment`.
EDIT_SIZES = range(18, 27)
EDIT_SHIFT = 4


def edit_geometry(rng: np.random.Generator) -> tuple[int, int, int, int]:
    """A random (font size, stroke, dx, dy) of an edit's source, which its result keeps."""
    dx, dy = rng.integers(-EDIT_SHIFT, EDIT_SHIFT + 1, size=2)
    return int(rng.integers(EDIT_SIZES.start, EDIT_SIZES.stop)), int(rng.integers(0, 2)), int(dx), int(dy)


@lru_cache(maxsize=1)
def edit_bank() -> torch.Tensor:
    """Every digit at every edit geometry: (G, 10, 1, SIZE, SIZE) in [-1, 1], G = sizes x strokes x offsets^2;
    entries [g, a] and [g, b] are an edit from digit a to digit b (the same place, size and stroke)."""
    shifts = range(-EDIT_SHIFT, EDIT_SHIFT + 1)
    pixels = [[draw(d, s, k, dx, dy) for d in CHARSET] for s in EDIT_SIZES for k in (0, 1) for dx in shifts
              for dy in shifts]  # fmt: skip
    return torch.from_numpy(np.array(pixels)).float().div(127.5).sub(1.0).unsqueeze(2)


def ink_box(images: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """Where the ink of each image (B, 1, H, W) in [0, 1] is: (B, 3) float, the centre x and y of the box around
    the pixels above `threshold` and its height, in pixels; an empty image gives (SIZE / 2, SIZE / 2, 0)."""
    ink = images[:, 0] > threshold
    rows, cols = ink.any(2), ink.any(1)
    index = torch.arange(images.shape[-1], device=images.device).float()

    def span(hit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first = torch.where(hit, index, float("inf")).amin(1)
        last = torch.where(hit, index, -float("inf")).amax(1)
        return first, last

    (top, bottom), (left, right) = span(rows), span(cols)
    empty = ~rows.any(1)
    centre = torch.full_like(top, SIZE / 2)
    cx = torch.where(empty, centre, (left + right) / 2)
    cy = torch.where(empty, centre, (top + bottom) / 2)
    return torch.stack([cx, cy, torch.where(empty, torch.zeros_like(top), bottom - top + 1)], 1)


def edit_set(count: int, seed: int) -> tuple[list[str], list[dict]]:
    """`count` edits, seeded: prompts (the requested digit; each digit count/10 times) and metadata with the source
    image ("sources": [(1, SIZE, SIZE) float in [0, 1]]), its digit ("source_digit") and where the requested
    digit's ink belongs ("target_box": `ink_box` of the requested digit rendered with the source's geometry)."""
    rng = np.random.default_rng(seed)
    prompts, metadata = [], []
    for i in range(count):
        target = CHARSET[i % len(CHARSET)]
        source = CHARSET[(CHARSET.index(target) + int(rng.integers(1, len(CHARSET)))) % len(CHARSET)]
        geometry = edit_geometry(rng)
        pixels = torch.from_numpy(np.stack([draw(source, *geometry), draw(target, *geometry)])).float().div(255)
        prompts.append(target)
        metadata.append({"sources": [pixels[0:1]], "source_digit": source,
                         "target_box": ink_box(pixels[1:2, None])[0].tolist()})  # fmt: skip
    return prompts, metadata


EDIT_SETS = {"edits": lambda: edit_set(500, seed=1), "edits_val": lambda: edit_set(20, seed=2)}
"""Edit prompt sets by name: 500 training edits and 20 validation edits (two per requested digit), disjoint seeds."""
