"""FLUX-shaped attention, forward and backward, through PyTorch's flash kernel and cuDNN's, on one GPU.

Issue 32's goal 2: the FLUX recipes kept cuDNN's attention out (`engine.cudnn_attention=false`) from 17d93a8, when
its backward failed in FLUX.1's training on an H200, to c707bb8, and attention was 16% of FLUX's warm step on the
flash kernel. This times both kernels on diffusers' layout (q, k, v as (B, S, H, D) tensors seen as (B, H, S, D)),
on contiguous copies, through torch.compile (as the recipes' regional compile runs it), and with the output's
gradient a slice of a wider tensor (`padded`, as FLUX's single blocks give it: their attention output is
concatenated with the MLP's along features; the recipe failed in cuDNN's backward until the engine's
`dense_attention_grads` copied it dense, but this case alone ran on an H100), at FLUX.1's sequence lengths (512 text
tokens with 1024, 2048 or 4096 image tokens), and compares cuDNN's output and query gradient with flash's. Each case
runs in a process of its own: an illegal memory access ends the CUDA context.

    python benchmarks/attention_kernels.py               # every case, a line each
    python benchmarks/attention_kernels.py cudnn view 1536   # one case
    python benchmarks/attention_kernels.py cudnn padded 1536 /tmp/x 16   # one case at batch 16 (the FLUX recipes')
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
CASES = [("flash", "view"), ("cudnn", "view"), ("cudnn", "contig"), ("flash", "compiled"), ("cudnn", "compiled"),
         ("cudnn", "padded")]  # fmt: skip


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str) -> torch.Tensor:
    """(B, S, H, D) inputs attended as (B, H, S, D), diffusers' native dispatch."""
    with sdpa_kernel(KERNELS[kernel]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


def run(kernel: str, layout: str, seq: int, folder: str, batch: int, heads: int = 24, dim: int = 128,
        iters: int = 10) -> None:  # fmt: skip
    torch.manual_seed(0)
    leaves = [torch.randn(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(3)]  # fmt: skip
    grad = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
    if layout == "padded":  # the same values as FLUX's single blocks hand them back: a slice of a wider row
        wide = torch.zeros(batch, seq, heads * dim * 5, device="cuda", dtype=torch.bfloat16)
        wide[..., : heads * dim] = grad.transpose(1, 2).reshape(batch, seq, heads * dim)
        grad = wide[..., : heads * dim].view(batch, seq, heads, dim).transpose(1, 2)
    fn = torch.compile(attention) if layout == "compiled" else attention

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        if layout == "contig":  # (B, H, S, D) copies
            with sdpa_kernel(KERNELS[kernel]):
                out = F.scaled_dot_product_attention(*(t.transpose(1, 2).contiguous() for t in leaves))
        else:
            out = fn(*leaves, kernel)
        return out, torch.autograd.grad(out, leaves, grad)[0]

    out, dq = step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    torch.save({"out": out.detach()[0, :2].float().cpu(), "dq": dq[0, :, :2].float().cpu()},
               f"{folder}/{kernel}_{layout}_{seq}.pt")  # fmt: skip
    flop = 4 * batch * heads * seq * seq * dim * 3.5  # forward 4·B·H·S²·D, backward 2.5 times that
    print(
        f"{kernel:5s} {layout:8s} S={seq:5d} {ms:7.2f} ms fwd+bwd {flop / ms / 1e9:4.0f} TFLOP/s "
        f"finite={bool(torch.isfinite(dq).all())}",
        flush=True,
    )


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, "cuDNN", torch.backends.cudnn.version(), flush=True)
    folder = tempfile.mkdtemp()  # this run's results only, for the comparison with flash
    for seq in (1536, 2560, 4608):
        for kernel, layout in CASES:
            done = subprocess.run([sys.executable, __file__, kernel, layout, str(seq), folder], capture_output=True,
                                  text=True)  # fmt: skip
            print(done.stdout.strip() or f"{kernel:5s} {layout:8s} S={seq:5d} failed, rc {done.returncode}: "
                  f"{done.stderr.strip()[-300:]}", flush=True)  # fmt: skip
            flash = Path(folder) / f"flash_view_{seq}.pt"
            if done.returncode == 0 and kernel == "cudnn" and flash.exists():
                a, b = torch.load(flash), torch.load(f"{folder}/{kernel}_{layout}_{seq}.pt")
                print(f"      against flash: output {float((a['out'] - b['out']).abs().max()):.2e}, query gradient "
                      f"{float((a['dq'] - b['dq']).abs().max()):.2e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1:
        folder = sys.argv[4] if len(sys.argv) > 4 else tempfile.mkdtemp()
        batch = int(sys.argv[5]) if len(sys.argv) > 5 else 8
        run(sys.argv[1], sys.argv[2], int(sys.argv[3]), folder, batch)
    else:
        main()
