"""Rewards of videos: outputs (B, F, C, H, W) in [0, 1] from a video model (Wan, the glyphs video world).

`per_frame` turns any image reward into a video reward: it scores every frame as an image (the prompt and
metadata repeated, the frame's index in metadata "frame") and reduces over the frames. `reward.per_frame`
names the rewards it applies to and their reduction (`resolve` wraps them). Frames get no metadata "group": a
group-wise reward (`rewards.pairwise`) would make the frames of one video compete with each other, so it fails
for want of one (and `config.validate` refuses the built-in ones under `reward.per_frame`).

`temporal_consistency` scores how alike a video's frames are (VBench's subject and background consistency, on
CLIP image embeddings or on pixels); a still video maximises it, so it is a term beside a content reward. `vlm_video` is
the VLM judge (`rewards.vlm`) shown evenly spaced frames of each video, in order, in one message.
"""

from functools import partial

import torch

from omnialign.rewards.base import Outputs, RewardFn, Scores
from omnialign.rewards.preference import _clip, pixels
from omnialign.rewards.vlm import VIDEO_JUDGE_PROMPT, judge

REDUCTIONS = ("mean", "min")


def videos_of(outputs: Outputs, reward: str) -> torch.Tensor:
    """The outputs as a video batch, or a ValueError naming the reward that needs videos."""
    if not isinstance(outputs, torch.Tensor) or outputs.ndim != 5 or outputs.shape[2] not in (1, 3):
        kind = f"a tensor of shape {tuple(outputs.shape)}" if isinstance(outputs, torch.Tensor) else type(outputs)
        raise ValueError(f"reward {reward!r} scores videos (B, F, 1 or 3, H, W) in [0, 1]; got {kind}")
    return outputs


def _per_frame(
    fn: RewardFn, name: str, reduce: str, videos: Outputs, prompts: list[str], metadata: list[dict]
) -> Scores:
    videos = videos_of(videos, f"per_frame({name})")
    b, f = videos.shape[:2]
    frame_prompts = [p for p in prompts for _ in range(f)]
    frame_meta = [{**{k: v for k, v in m.items() if k != "group"}, "frame": i} for m in metadata for i in range(f)]
    values = fn(videos.flatten(0, 1), frame_prompts, frame_meta)
    if len(values) != b * f:
        raise ValueError(f"per_frame({name}) got {len(values)} scores for {b * f} frames")
    scores = torch.tensor([float(v) for v in values], dtype=torch.float64).view(b, f)
    total = scores.mean(1) if reduce == "mean" else scores.amin(1)
    info = [{"frames": row} for row in scores.tolist()]
    if isinstance(values, Scores):
        for i in range(b):
            info[i]["frame_info"] = values.info[i * f : (i + 1) * f]
    return Scores(total.tolist(), info)


def per_frame(fn: RewardFn, name: str, reduce: str) -> RewardFn:
    """The video reward that scores each frame with the image reward `fn` (called `name`) and reduces the frame
    scores by `reduce` ("mean" or "min"); info: "frames" (each frame's score) and "frame_info" (fn's info)."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"reward.per_frame[{name!r}]={reduce!r}: the reduction over frames is one of {REDUCTIONS}")
    return partial(_per_frame, fn, name, reduce)


def temporal_consistency(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    path: str | None = None,
    processor: str | None = None,
    device: str | None = None,
) -> Scores:
    """Reward: VBench's subject / background consistency, the mean over frames i >= 1 of (sim(i, 0) + sim(i, i-1))
    / 2, in [0, 1]; higher is steadier. sim is max(0, cos) of the frames' CLIP image embeddings with `path` (a local
    CLIPModel folder), else 1 - mean |x_i - x_j| of the pixels. A still video scores 1: use it beside a content
    reward, never alone. info: "first" and "previous", the means of sim(i, 0) and sim(i, i-1)."""
    videos = videos_of(outputs, "temporal_consistency")
    b, f = videos.shape[:2]
    if f < 2:
        raise ValueError(f"reward 'temporal_consistency' compares frames; got videos of {f} frame")
    if path is None:
        x = videos.float().flatten(2)
        to_first = 1 - (x[:, 1:] - x[:, :1]).abs().mean(-1)
        to_previous = 1 - (x[:, 1:] - x[:, :-1]).abs().mean(-1)
    else:
        device = str(device or videos.device)
        model, _, image_processor = _clip("temporal_consistency", path, processor, device)
        frames = pixels(videos.flatten(0, 1), image_processor, device)
        e = model.get_image_features(pixel_values=frames).pooler_output.float().view(b, f, -1)
        e = e / e.norm(dim=-1, keepdim=True)
        to_first = (e[:, 1:] * e[:, :1]).sum(-1).clamp(min=0)
        to_previous = (e[:, 1:] * e[:, :-1]).sum(-1).clamp(min=0)
    first, previous = to_first.mean(1).tolist(), to_previous.mean(1).tolist()
    return Scores(((to_first + to_previous) / 2).mean(1).tolist(),
                  [{"first": a, "previous": p} for a, p in zip(first, previous)])  # fmt: skip


def sampled_frames(videos: torch.Tensor, frames: int) -> list[list[torch.Tensor]]:
    """`frames` evenly spaced frames of each video (the first and the last among them; all when it has fewer)."""
    n = videos.shape[1]
    index = torch.linspace(0, n - 1, min(frames, n)).round().long().tolist()
    return [[video[i] for i in index] for video in videos]


def vlm_video(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    url: str,
    model: str,
    frames: int = 4,
    prompt: str = VIDEO_JUDGE_PROMPT,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    concurrency: int = 8,
) -> Scores:
    """Reward: `vlm_judge` of `frames` evenly spaced frames of each video, sent in order as images of one message
    ("{frames}" in `prompt` is their count): the 1-5 ratings' mean mapped to [0, 1]; higher is better."""
    if frames < 1:
        raise ValueError(f"reward 'vlm_video': frames={frames}; sample at least 1 frame of each video")
    images = sampled_frames(videos_of(outputs, "vlm_video"), frames)
    texts = [prompt.replace("{frames}", str(len(images[0]))).replace("{prompt}", p) for p in prompts]
    return judge(images, texts, url=url, model=model, sampling=sampling, api_key=api_key, timeout=timeout,
                 concurrency=concurrency)  # fmt: skip
