"""Rewards for image editing: a VLM's ratings of instruction following and of preservation, OCR of the edited
text, and the pixel preservation of the source. Users combine them with `reward.weights`.

Each is a reward `fn(images, prompts, metadata, **options)`: `images` (B, C, H, W) in [0, 1] are the edit
results, `prompts` the instructions, and `metadata[i]["sources"]` sample i's source images as float tensors
(C, H, W) in [0, 1], as the online trainer passes them (decoded from a prompt file of `omnialign prepare
edit`); a source's size and channel count may differ from the result's. All scores are in [0, 1], higher
is better:

- `vlm_edit_following`, `vlm_edit_preservation`: a VLM behind an OpenAI-compatible chat endpoint sees the
  source image(s), then the result, and the instruction, and rates one aspect from 1 to 5 (the last number
  after "Following" or "Preservation" on its line, as `vlm.parse_judge` reads it), mapped to (s - 1) / 4; a
  reply without it scores 0. `info`: the raw reply and the mapped score (or `missing`).
- `ocr_edit`: Tesseract's reading of the result against `metadata["target_text"]`, scored as the `ocr`
  reward scores (`ocr.ocr_similarity`).
- `pixel_preservation`: 1 - the mean absolute difference, per pixel and channel, between the result and its
  first source (resized to the result's size, bilinear with antialiasing; compared in grayscale, the mean of
  the channels, when the channel counts differ), over the pixels outside `metadata["mask"]` when given (a
  tensor (H, W) or (1 or 3, H, W) in [0, 1], or an image's path or bytes; white, 1, marks where the edit may
  change the image; resized to the result's size by area averaging; a mask covering everything scores 1).
  An unchanged source scores 1.0.
"""

from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from omnialign.rewards.base import Outputs, Scores, from_png, images_of
from omnialign.rewards.ocr import ocr
from omnialign.rewards.vlm import judge

EDIT_PROMPT = """You are shown the source image of an image edit (or several source images), then, as the last \
image, the result of editing it with this instruction:
{prompt}
{question}, as an integer from 1 (poor) to 5 (excellent).
Explain briefly, then end your reply with exactly this line:
{aspect} Score: X"""

QUESTIONS = {
    "following": "Rate how completely and correctly the result carries out the instruction",
    "preservation": "Rate how well the result keeps everything the instruction does not ask to change (subject "
    "identity, layout, background, style and detail)",
}


def sources_of(meta: dict, i: int, reward: str) -> list[torch.Tensor]:
    """Sample i's source images (tensors (C, H, W)); ValueError naming the sample and the fix otherwise."""
    sources = meta.get("sources")
    if not isinstance(sources, list) or not sources or not all(isinstance(s, torch.Tensor) for s in sources):
        raise ValueError(f'reward {reward!r}: metadata[{i}]["sources"] is {sources!r:.100}, not a list of source '
                         "image tensors (C, H, W) in [0, 1]; train an editing model on a prompt file of `omnialign "
                         "prepare edit` (the trainer decodes them), or decode them with "
                         "omnialign.data.prompts.source_images")  # fmt: skip
    return sources


def _vlm_edit(
    aspect: str,
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    url: str,
    model: str,
    prompt: str | None = None,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    concurrency: int = 8,
) -> Scores:
    """Reward: a VLM's 1-5 rating of one aspect of each edit (source(s), result, instruction), mapped to [0, 1]."""
    name = f"vlm_edit_{aspect}"
    images = images_of(outputs, name)
    shown = [[*sources_of(meta, i, name), image] for i, (image, meta) in enumerate(zip(images, metadata))]
    template = prompt or EDIT_PROMPT.replace("{question}", QUESTIONS[aspect]).replace("{aspect}", aspect.title())
    return judge(shown, [template.replace("{prompt}", p) for p in prompts], url=url, model=model, sampling=sampling,
                 api_key=api_key, timeout=timeout, concurrency=concurrency, dimensions=(aspect,))  # fmt: skip


vlm_edit_following = partial(_vlm_edit, "following")
vlm_edit_preservation = partial(_vlm_edit, "preservation")


def ocr_edit(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    psm: int = 11,
    lang: str = "eng",
    concurrency: int = 4,
) -> Scores:
    """Reward: OCR similarity of Tesseract's reading of the result to `metadata["target_text"]`, in [0, 1]."""
    missing = [i for i, meta in enumerate(metadata) if not meta.get("target_text")]
    if missing:
        raise ValueError(f'reward ocr_edit: metadata[{missing[0]}] has no "target_text" ({len(missing)} samples '
                         "without); give each edit the text it should render (the target_text column of "
                         "`omnialign prepare edit`)")  # fmt: skip
    targets = [{"ground_truth": meta["target_text"]} for meta in metadata]
    return ocr(outputs, prompts, targets, psm=psm, lang=lang, concurrency=concurrency)


def _resized(image: torch.Tensor, size: torch.Size, mode: str = "bilinear") -> torch.Tensor:
    """An image (C, H, W) at size (H', W'): bilinear with antialiasing, or "area" (averages); as it is when the
    size matches."""
    if image.shape[-2:] == size:
        return image
    bilinear = {"antialias": True, "align_corners": False} if mode == "bilinear" else {}
    return F.interpolate(image[None], size=tuple(size), mode=mode, **bilinear)[0]


def _mask(mask: object, i: int) -> torch.Tensor:
    """A mask (tensor, or an image's path or bytes) as (1, H, W) in [0, 1]."""
    if isinstance(mask, (str, bytes)):
        mask = from_png(mask if isinstance(mask, bytes) else Path(mask).read_bytes())
    if not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 3):
        raise ValueError(f'reward pixel_preservation: metadata[{i}]["mask"] is {mask!r:.100}; give a tensor '
                         "(H, W) or (C, H, W) in [0, 1], or an image's path or bytes (white where the edit may "
                         "change the image)")  # fmt: skip
    return mask.float().reshape(-1, *mask.shape[-2:]).mean(0, keepdim=True)


def pixel_preservation(outputs: Outputs, prompts: list[str], metadata: list[dict]) -> list[float]:
    """Reward: 1 - mean absolute difference of the result to its first source outside metadata "mask", in [0, 1]."""
    images = images_of(outputs, "pixel_preservation")
    values = []
    for i, (image, meta) in enumerate(zip(images, metadata, strict=True)):
        image = image.float()
        source = _resized(sources_of(meta, i, "pixel_preservation")[0].to(image), image.shape[-2:])
        if source.shape[0] != image.shape[0]:
            source, image = source.mean(0, keepdim=True), image.mean(0, keepdim=True)
        keep = torch.ones_like(image[:1])
        if meta.get("mask") is not None:
            keep = 1 - _resized(_mask(meta["mask"], i).to(image), image.shape[-2:], "area").clamp(0, 1)
        difference = (image - source).abs().mean(0, keepdim=True)
        values.append(1.0 if keep.sum() == 0 else float(1 - (difference * keep).sum() / keep.sum()))
    return values
