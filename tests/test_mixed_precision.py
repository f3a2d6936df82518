"""FSDP2's mixed precision computes what the model's own pipeline computes in bfloat16: with the trained weights
kept in float32 and gathered in bfloat16, the network's velocity equals that of the model loaded in bfloat16, bit for
bit on the CPU. Before, each FSDP unit cast its floating inputs to bfloat16: SD3's, Wan's and Z-Image's float32
timestep (386.7 became 386) and the float32 rotary tables of FLUX.1, FLUX.2 and LTX-2 (1e-2 off). Wan keeps some
modules in float32 (`_keep_in_fp32_modules`: the time embedder, the norms, the scale-shift tables), which FSDP
gathers in bfloat16 like the rest: its velocity stays 0.6% off."""

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor

from omnialign.config import ModelConfig
from omnialign.engine import dist, fsdp
from omnialign.models import LOADERS, lora, tiny

TWINS = {"sd3": tiny.sd3, "qwen_image": tiny.qwen_image, "zimage": tiny.zimage, "flux": tiny.flux,
         "flux2": tiny.flux2, "ltx2": tiny.ltx2, "wan": tiny.wan}  # fmt: skip


@pytest.mark.parametrize("arch", list(TWINS))
def test_sharded_float32_weights_compute_as_the_bfloat16_model(arch, tmp_path):
    frames = {"ltx2": 9, "wan": 5}.get(arch, ModelConfig.frames)
    policy = LOADERS[arch](ModelConfig(arch=arch, path=str(TWINS[arch](tmp_path)), dtype="bfloat16", frames=frames))
    world = dist.init()
    size = 64 if arch == "ltx2" else 32
    x = torch.randn((2, *policy.latent_shape(size, size)), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.3867, 0.7431], device=world.device)
    with torch.no_grad():
        net = copy.deepcopy(policy.transformer).float()  # the trainer's float32 master weights
        policy.to(world.device).transformer.to(world.device)
        cond, x = policy.encode_prompts(["a red cube", "two cats"]), x.to(world.device)
        expected = policy.velocity(x, sigma, cond)
        names = {id(m): name for name, m in policy.transformer.named_modules()}
        blocks = [net.get_submodule(names[id(b)]) for b in policy.blocks()]
        policy.transformer = fsdp.shard(net, blocks, fsdp.mesh(world), torch.bfloat16)
        got = policy.velocity(x, sigma, cond)
    assert got.dtype == expected.dtype == torch.bfloat16
    if arch == "wan":
        assert 0 < (got - expected).float().norm() / expected.float().norm() < 0.01
    else:
        assert torch.equal(got, expected)


def test_selective_activation_checkpointing_recomputes_every_kth_block_with_the_same_gradients(tmp_path):
    """engine.checkpoint_every=2: blocks 0, 2, 4, ... recompute their activations in backward, the others keep them;
    the loss and every gradient equal those without checkpointing, bit for bit on the CPU."""
    policy = LOADERS["sd3"](ModelConfig(arch="sd3", path=str(tiny.sd3(tmp_path))))
    world = dist.init()
    x = torch.randn((2, *policy.latent_shape(32, 32)), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.3867, 0.7431])
    cond = policy.encode_prompts(["a red cube", "two cats"])
    grads, wrapped, original = [], [], policy.transformer
    for checkpointing in (False, True):
        net = copy.deepcopy(original).float().requires_grad_(True)
        blocks = list(net.transformer_blocks)
        fsdp.shard(net, blocks, fsdp.mesh(world), torch.float32, checkpointing, checkpoint_every=2)
        wrapped.append([b.forward.__name__ == "checkpointed" for b in blocks])
        policy.transformer = net
        policy.velocity(x, sigma, cond).square().mean().backward()
        grads.append([p.grad.full_tensor() for p in net.parameters()])
    assert wrapped == [[False] * len(blocks), [i % 2 == 0 for i in range(len(blocks))]] and len(blocks) >= 2
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_one_rank_leaves_frozen_bf16_weights_unmanaged_and_computes_as_before(tmp_path):
    """Over one rank `fsdp.shard` leaves the frozen weights already in the compute dtype as the module's own tensors
    (no copy before each forward), while FSDP keeps the trained LoRA adapters (float32) and the frozen weights Wan
    keeps in float32, casting both to bf16: the velocity and the adapters' gradients are those of the unsharded
    model with every parameter in bf16, bit for bit."""
    policy = LOADERS["wan"](ModelConfig(arch="wan", path=str(tiny.wan(tmp_path)), dtype="bfloat16", frames=5))
    world = dist.init()
    net = policy.transformer.to(world.device)
    lora.apply_lora(net, 4, 4, policy.lora_targets)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    kept = [p for p in net.parameters() if not p.requires_grad and p.dtype == torch.float32]
    frozen = {n: p.data_ptr() for n, p in net.named_parameters() if not p.requires_grad and p.dtype == torch.bfloat16}
    assert kept and frozen
    unsharded = copy.deepcopy(net)
    for p in unsharded.parameters():  # what FSDP's mixed precision computes (buffers stay as they are)
        p.data = p.data.to(torch.bfloat16)
    fsdp.shard(net, policy.blocks(), fsdp.mesh(world), torch.bfloat16)
    params = dict(net.named_parameters())
    assert params.keys() == {n for n, _ in unsharded.named_parameters()}
    for name, p in params.items():  # the frozen bf16 weights where they lay, the others FSDP's
        assert (
            (not isinstance(p, DTensor) and p.data_ptr() == frozen[name]) if name in frozen else isinstance(p, DTensor)
        )
    x = torch.randn((2, *policy.latent_shape(32, 32)), generator=g).to(world.device, torch.bfloat16)
    sigma = torch.tensor([0.3867, 0.7431], device=world.device)
    cond = policy.to(world.device).encode_prompts(["a red cube", "two cats"])
    outputs = []
    for network in (net, unsharded):
        policy.transformer = network
        velocity = policy.velocity(x, sigma, cond)
        velocity.float().square().mean().backward()
        grads = {n: p.grad for n, p in network.named_parameters() if "lora_" in n}
        outputs.append(
            (velocity, {n: (d.to_local() if isinstance(d, DTensor) else d).float() for n, d in grads.items()})
        )
    (v_sharded, g_sharded), (v_unsharded, g_unsharded) = outputs
    assert torch.equal(v_sharded, v_unsharded) and g_sharded.keys() == g_unsharded.keys()
    for name in g_sharded:
        assert torch.equal(g_sharded[name], g_unsharded[name]), name
