"""Sequence parallelism (engine/sequence.py): two processes (torchrun, gloo on the CPU) split each sample's tokens of
tiny Wan and Qwen-Image transformers, sharded with FSDP2 over the same processes, and compute the velocities and
parameter gradients of one process.

Run by pytest, this file saves the tiny transformers and their inputs, launches itself under torchrun (the `__main__`
part is each process's work) and compares what rank 0 wrote against the same network run here in one process.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from diffusers import ModelMixin, QwenImageTransformer2DModel, WanTransformer3DModel

from omnialign.engine import dist as engine_dist
from omnialign.engine import fsdp, sequence

WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
           text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
           qk_norm="rms_norm_across_heads", rope_max_seq_len=32)  # fmt: skip
QWEN_IMAGE = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4))  # fmt: skip
# name: (class, the blocks FSDP2 shards, tokens per sample, how many of them each of the 2 processes takes)
NETWORKS = {"wan": (WanTransformer3DModel, lambda net: net.blocks, 48),
            "qwen_image": (QwenImageTransformer2DModel, lambda net: net.transformer_blocks, 16)}  # fmt: skip


def save_network_and_inputs(folder: Path) -> None:
    """Both tiny networks (random, seeded) and a batch of two samples for each."""
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    WanTransformer3DModel(**WAN).save_pretrained(folder / "wan")
    # 3 latent frames of 8 x 8: 48 tokens per sample after 2 x 2 patches; 7 text tokens, not split
    wan = dict(hidden_states=torch.randn(2, 4, 3, 8, 8, generator=generator), timestep=torch.tensor([700.0, 150.0]),
               encoder_hidden_states=torch.randn(2, 7, 16, generator=generator))  # fmt: skip
    torch.save(wan, folder / "wan" / "inputs.pt")
    QwenImageTransformer2DModel(**QWEN_IMAGE).save_pretrained(folder / "qwen_image")
    # 16 packed image tokens and 6 text tokens (split too; the second prompt padded to 6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    qwen_image = dict(hidden_states=torch.randn(2, 16, 16, generator=generator), timestep=torch.tensor([0.7, 0.15]),
                      encoder_hidden_states=torch.randn(2, 6, 16, generator=generator), encoder_hidden_states_mask=mask,
                      img_shapes=[[(1, 4, 4)]] * 2)  # fmt: skip
    torch.save(qwen_image, folder / "qwen_image" / "inputs.pt")


def velocities_and_gradients(network: ModelMixin, inputs: dict) -> tuple[torch.Tensor, dict]:
    """The velocities of a batch and the parameter gradients of a fixed loss on them."""
    velocity = network(**inputs, return_dict=False)[0]
    velocity.square().mean().backward()
    return velocity.detach(), {name: p.grad for name, p in network.named_parameters() if p.grad is not None}


def run_split(folder: Path) -> None:
    """One process of the group: a head count the group does not divide fails; for each network, split the tokens,
    shard with FSDP2 over the same processes and write the velocities and the gradients of the group."""
    world = engine_dist.init()
    device_mesh = sequence.mesh(world, 2)
    three_heads = WanTransformer3DModel(**{**WAN, "num_attention_heads": 3, "attention_head_dim": 8})
    with pytest.raises(ValueError, match="a sequence-parallel group of 2 must divide the network's 3 attention heads"):
        sequence.split_sequence(three_heads, device_mesh)
    for name, (cls, blocks, _) in NETWORKS.items():
        network = cls.from_pretrained(folder / name)
        sequence.split_sequence(network, device_mesh)
        fsdp.shard(network, list(blocks(network)), fsdp.mesh(world), torch.float32)  # as the trainer shards it
        tokens = []  # the image tokens this process runs through the network (proj_out's output is gathered)
        network.proj_out.register_forward_pre_hook(lambda module, args, tokens=tokens: tokens.append(args[0].shape[1]))
        velocity, grads = velocities_and_gradients(network, torch.load(folder / name / "inputs.pt"))
        # FSDP2 averages the gradients over the 2 processes; the group's gradient is their sum
        grads = {key: 2 * grad.full_tensor() for key, grad in grads.items()}
        if world.is_main:
            torch.save({"velocity": velocity, "grads": grads, "tokens": tokens}, folder / name / "split.pt")


def test_two_processes_split_tokens_like_one_process(tmp_path):
    save_network_and_inputs(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__, str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    for name, (cls, _, tokens) in NETWORKS.items():
        split = torch.load(tmp_path / name / "split.pt")
        assert split["tokens"] == [tokens // 2], name  # each process ran half of the sample's tokens
        one = cls.from_pretrained(tmp_path / name)
        velocity, grads = velocities_and_gradients(one, torch.load(tmp_path / name / "inputs.pt"))
        torch.testing.assert_close(split["velocity"], velocity, rtol=1e-5, atol=1e-6, msg=name)
        assert grads.keys() == split["grads"].keys(), name
        # nearly every parameter takes part in the loss (not the last block's text-side ones, which the image skips)
        assert sum(bool(grad.any()) for grad in grads.values()) > 0.8 * len(list(one.parameters())), name
        for key, grad in grads.items():
            torch.testing.assert_close(split["grads"][key], grad, rtol=1e-4, atol=1e-7, msg=f"{name} {key}")


def test_group_size_must_divide_the_processes():
    with pytest.raises(ValueError, match=r"a sequence-parallel group of 2 .* number of processes \(3\)"):
        sequence.mesh(engine_dist.World(rank=0, size=3, device=torch.device("cpu")), 2)


if __name__ == "__main__":
    run_split(Path(sys.argv[1]))
    # Skip the interpreter's teardown. In CI a rank has twice aborted after its work ("terminate called without an
    # active exception", exit -6), once with and once without destroy_process_group; gloo's threads and pending
    # functional-collective work can outlive the interpreter (pytorch/pytorch#179291). 67 runs under load here did not
    # repeat it. Every collective is over once both ranks pass the barrier, and rank 0 has written its results.
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
