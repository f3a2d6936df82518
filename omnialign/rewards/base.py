"""What every reward shares: the function type, per-sample info, and images as PNG.

A reward is `fn(outputs, prompts, metadata) -> list[float]`: `outputs` is a float image tensor
(B, C, H, W) in [0, 1] (C = 1 or 3), a video tensor (B, F, C, H, W) in [0, 1] (`rewards.video`)
or a list of B response strings; `prompts` B strings; `metadata` B dicts (`ground_truth`,
`data_source`, ...). A reward that has more to say per sample (a judge's raw reply, a
transcription) returns `Scores(values, info)`: still a list of floats, with `info` one
JSON-serialisable dict per sample; `rewards.score` collects it.
"""

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image

Outputs = torch.Tensor | list[str]
RewardFn = Callable[[Outputs, list[str], list[dict]], list[float]]


class Scores(list):
    """A list of B floats and `info`, B dicts of per-sample details (JSON-serialisable)."""

    def __init__(self, values: list[float], info: list[dict] | None = None):
        wrong = [v for v in values if isinstance(v, str | bytes | bool) or v is None]
        if wrong:
            raise TypeError(f"Scores got {type(wrong[0]).__name__} {wrong[0]!r} ({len(wrong)} such): a reward returns "
                            "numbers, never strings, bools or None")  # fmt: skip
        super().__init__(float(v) for v in values)
        self.info = [{} for _ in self] if info is None else list(info)
        if len(self.info) != len(self):
            raise ValueError(f"Scores got {len(self)} values but {len(self.info)} info dicts")


def images_of(outputs: Outputs, reward: str) -> torch.Tensor:
    """The outputs as an image batch, or a ValueError naming the reward that needs images."""
    if not isinstance(outputs, torch.Tensor) or outputs.ndim != 4 or outputs.shape[1] not in (1, 3):
        kind = f"a tensor of shape {tuple(outputs.shape)}" if isinstance(outputs, torch.Tensor) else type(outputs)
        video = isinstance(outputs, torch.Tensor) and outputs.ndim == 5
        hint = f'; to score each frame of videos, set reward.per_frame={{"{reward}": "mean"}}' if video else ""
        raise ValueError(f"reward {reward!r} scores images (B, 1 or 3, H, W) in [0, 1]; got {kind}{hint}")
    return outputs


def texts_of(outputs: Outputs, reward: str) -> list[str]:
    """The outputs as response strings, or a ValueError naming the reward that needs text."""
    if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        raise ValueError(f"reward {reward!r} scores text responses (a list of str); got {type(outputs).__name__}")
    return outputs


def to_pil(image: torch.Tensor) -> Image.Image:
    """One image (C, H, W) in [0, 1] as an 8-bit grayscale or RGB PIL image."""
    pixels = image.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu().numpy()
    return Image.fromarray(pixels[0]) if pixels.shape[0] == 1 else Image.fromarray(pixels.transpose(1, 2, 0))


def to_png(image: torch.Tensor) -> bytes:
    """One image (C, H, W) in [0, 1] as PNG bytes (8 bits per channel)."""
    buffer = io.BytesIO()
    to_pil(image).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


@contextmanager
def _opened(source: bytes | str | Path, where: str) -> Iterator[Image.Image]:
    """Pillow's image of a file or its bytes; its errors (and those of the block) as ValueError naming `where`."""
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            yield image
    except Image.DecompressionBombError as e:
        raise ValueError(f"{where} is too large to decode ({e}); send or store smaller images") from None
    except (OSError, ValueError, SyntaxError) as e:  # Pillow's errors for truncated or unknown data
        raise ValueError(f"{where} is not a readable image ({e})") from None


def open_image(source: bytes | str | Path, where: str = "image") -> Image.Image:
    """An image file or its bytes (any format Pillow reads), fully decoded, as 8-bit grayscale ("L") from every
    grayscale mode (16-bit values scaled, not clipped) or RGB from every other mode (alpha dropped): the one
    decoding of served frames, prompt sources and `prepare edit`. ValueError naming `where` when the data is no
    readable image or a decompression bomb (more pixels than Pillow's `Image.MAX_IMAGE_PIXELS` allows)."""
    with _opened(source, where) as image:
        if image.mode.startswith("I;16"):  # 16 bits per pixel: 65535 is white
            return Image.fromarray((np.asarray(image).astype(np.float32) / 257).round().astype(np.uint8))
        return image.convert("L" if image.mode in ("1", "L", "LA", "I", "F") else "RGB")


def check_image(source: bytes | str | Path, where: str = "image") -> None:
    """`open_image`'s checks without decoding the pixels (the header, Pillow's bomb limit, and for PNG every chunk's
    checksum): for checking a whole dataset's images at the start of a run."""
    with _opened(source, where) as image:
        image.verify()


def from_png(data: bytes | str | Path, where: str = "image") -> torch.Tensor:
    """An image (bytes or file; see `open_image`) as a float tensor (C, H, W) in [0, 1]: C=1 for grayscale, else 3."""
    pixels = torch.from_numpy(np.asarray(open_image(data, where)).copy()).float().div(255)
    return pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)
