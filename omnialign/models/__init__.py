"""Model adapters by architecture: `LOADERS[arch](model_config)` returns a `DiffusionPolicy` (glyphs, glyphs_video,
qwen_image, qwen_image_edit, sd3, flux, flux_kontext, flux2, flux2_klein, wan, zimage, ltx2) or a `LanguagePolicy`
(qwen3, qwen3_omni) on the CPU. `IMAGE_SIZES[arch]` is what an image architecture can draw: (the multiple its height
and width must be, the largest side or None)."""

from omnialign.config import ConfigError
from omnialign.models import flux, flux2, ltx2, qwen3, qwen3_omni, qwen_image, qwen_image_edit, sd3, wan, zimage
from omnialign.worlds import glyphs
from omnialign.worlds.glyphs import video as glyphs_video

LOADERS = {"glyphs": glyphs.load, "glyphs_video": glyphs_video.load, "qwen_image": qwen_image.load,
           "qwen_image_edit": qwen_image_edit.load, "sd3": sd3.load, "qwen3": qwen3.load,
           "qwen3_omni": qwen3_omni.load, "flux": flux.load, "flux_kontext": flux.load,
           "flux2": flux2.load, "flux2_klein": flux2.load,
           "wan": wan.load, "zimage": zimage.load,
           "ltx2": ltx2.load}  # fmt: skip
# pixels; VAE x patch for latents
IMAGE_SIZES = {"glyphs": (2, 32), "glyphs_video": (2, 32), "qwen_image": (16, None), "qwen_image_edit": (16, None),
               "sd3": (16, None), "flux": (16, None),
               "flux_kontext": (16, None), "flux2": (16, None), "flux2_klein": (16, None), "wan": (16, None),
               "zimage": (16, None),
               "ltx2": (32, None)}  # fmt: skip


def check_image_size(arch: str, height: int, width: int) -> None:
    """ConfigError naming rollout.height / rollout.width and the fix when `arch` cannot draw that size."""
    multiple, largest = IMAGE_SIZES[arch]
    if height % multiple or width % multiple or (largest and max(height, width) > largest):
        bound = f" and at most {largest}" if largest else ""
        raise ConfigError(
            f"rollout.height={height}, rollout.width={width}: model.arch={arch} draws sides divisible by "
            f"{multiple}{bound}; change rollout.height / rollout.width"
        )
