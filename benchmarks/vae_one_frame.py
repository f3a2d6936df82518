"""Qwen-Image's VAE on images, diffusers' causal 3D convolutions against `qwen_image.one_frame_conv` (the 2D
convolutions with the kernels' last time slice), side by side on one GPU: decode (the rollout decodes every image
once) and encode (Qwen-Image-Edit encodes every source) at the released VAE's size with random bf16 weights, 512x512
images, milliseconds per image, and the largest difference between the two outputs.

    python benchmarks/vae_one_frame.py            # batches 16 and 48, 512x512
    python benchmarks/vae_one_frame.py 16 1024    # one batch, 1024x1024
"""

import json
import sys
from functools import partial

import torch
from diffusers import AutoencoderKLQwenImage
from diffusers.models.autoencoders import autoencoder_kl_qwenimage

from omnialign.models import qwen_image


def timed(fn, iters: int = 3) -> float:
    """Milliseconds per call after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


@torch.no_grad()
def main(batches: list[int], size: int) -> None:
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage().to("cuda", torch.bfloat16).eval()
    conv = autoencoder_kl_qwenimage.QwenImageCausalConv3d
    for batch in batches:
        z = torch.randn(batch, vae.config.z_dim, 1, size // 8, size // 8, device="cuda", dtype=torch.bfloat16)
        image = torch.rand(batch, 3, 1, size, size, device="cuda", dtype=torch.bfloat16) * 2 - 1
        row = {"batch": batch, "size": size}
        outputs = {}
        for name, forward in (("3d", qwen_image.causal_conv), ("2d", qwen_image.one_frame_conv)):
            conv.forward = forward
            outputs[name] = vae.decode(z).sample.float()
            row[f"decode_{name}_ms_per_image"] = round(timed(partial(vae.decode, z)) / batch, 2)
            row[f"encode_{name}_ms_per_image"] = round(timed(partial(vae.encode, image)) / batch, 2)
        row["decode_max_abs_diff"] = (outputs["2d"] - outputs["3d"]).abs().max().item()
        row["peak_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(args[:1] or [16, 48], args[1] if len(args) > 1 else 512)
