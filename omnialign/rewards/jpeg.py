"""JPEG compressibility rewards (DDPO): the size of each image saved as JPEG at `quality` 95.

- `jpeg_compressibility` = -(JPEG size in kB, 1 kB = 1000 bytes): higher means smaller files,
  so maximising it makes images simpler and flatter.
- `jpeg_incompressibility` = +(JPEG size in kB): higher means larger files (more detail, noise).

Both scale with the image area (a 512x512 photo is tens of kB); weight them accordingly.
"""

import io

from omnialign.rewards.base import Outputs, images_of, to_pil


def jpeg_kb(outputs: Outputs, quality: int = 95) -> list[float]:
    """Each image's size in kB when saved as an 8-bit JPEG at `quality`."""
    sizes = []
    for image in images_of(outputs, "jpeg_compressibility"):
        buffer = io.BytesIO()
        to_pil(image).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return sizes


def jpeg_compressibility(
    outputs: Outputs, prompts: list[str], metadata: list[dict], *, quality: int = 95
) -> list[float]:
    """Reward: minus the JPEG size in kB; higher is more compressible."""
    return [-size for size in jpeg_kb(outputs, quality)]


def jpeg_incompressibility(
    outputs: Outputs, prompts: list[str], metadata: list[dict], *, quality: int = 95
) -> list[float]:
    """Reward: the JPEG size in kB; higher is less compressible."""
    return jpeg_kb(outputs, quality)
