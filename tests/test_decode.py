"""The language decoders against the training forward: the static-cache decoder (rollout/decode.py) and transformers'
`generate` (qwen3.CausalLMPolicy.generate) on the tiny Qwen3 twin. The same greedy tokens, the same sampling
filters, the recorded log-prob of every token through each row's stop token equal to the training forward's (0 and
padding after it), with and without a seeded LoRA adapter, on several seeds each forcing an early stop; on a GPU the
same in float32 and in bf16 with realistic logits over every attention kernel the recipes use, eager and graph."""

import copy
from contextlib import nullcontext

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import TopKLogitsWarper, TopPLogitsWarper

from omnialign.config import ModelConfig
from omnialign.engine import dist, fsdp
from omnialign.models import lora, qwen3, tiny
from omnialign.rollout import decode
from omnialign.rollout.language import left_pad

SAMPLING = (0.7, 20, 0.9)  # temperature, top-k, top-p


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return str(tiny.qwen3(tmp_path_factory.mktemp("qwen3") / "m"))


@pytest.fixture
def policy(path):
    return qwen3.load(ModelConfig(arch="qwen3", path=path))


def prompts(policy) -> tuple[torch.Tensor, torch.Tensor]:
    """Three chat prompts of different lengths, left-padded."""
    texts = ["Hi", "What is seven times six?", "Count: one, two"]
    ids, _ = policy.encode([[{"role": "user", "content": t}] for t in texts])
    return left_pad(ids, policy.pad_token_id)


def adapt(net: torch.nn.Module, seed: int, targets: list[str] = qwen3.ATTENTION) -> None:
    """A LoRA adapter on `targets` whose B matrices are drawn from N(0, 0.5) by a generator of `seed` (so that it
    changes what is sampled, and the same on every run whatever ran before)."""
    lora.apply_lora(net, 4, 4, targets)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def through_stop(out: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """(B, R) bool: each row's tokens through its first stop token (all of them for a row that did not stop)."""
    is_stop = torch.isin(out, torch.tensor(stop_ids, device=out.device)).long()
    return is_stop.cumsum(1) - is_stop == 0


def sampled(policy, decoder: str, ids, mask, stop_ids: list[int], seed: int, tokens: int = 10,
            sampling: tuple = SAMPLING, **kw) -> tuple:  # fmt: skip
    """(responses, log-probs) of one decoder sampling at `sampling` under `seed` with these stop tokens."""
    temperature, top_k, top_p = sampling
    torch.manual_seed(seed)
    if decoder == "static":
        return decode.generate(policy.transformer, ids, mask, stop_ids, policy.pad_token_id, tokens, temperature,
                               top_k, top_p, **kw)  # fmt: skip
    policy.stop_token_ids = stop_ids
    options = {"max_new_tokens": tokens, "do_sample": True, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    return policy.generate(ids, mask, None, options)


def check_against_training(policy, decoder: str, seed: int, device: str = "cpu", sampling: tuple = SAMPLING,
                           **kw) -> dict[str, torch.Tensor]:  # fmt: skip
    """Sample at `sampling` with one row forced to stop early (its second token of a free run made a stop token);
    check the padding and zero log-probs after each stop, and return the recorded and the training forward's
    log-probs of the kept tokens, and the responses."""
    ids, mask = (t.to(device) for t in prompts(policy))
    free, _ = sampled(policy, decoder, ids, mask, [], seed, sampling=sampling, **kw)
    row = seed % len(ids)
    stops = sorted({*policy.stop_token_ids, int(free[row, 1])})
    out, lp = sampled(policy, decoder, ids, mask, stops, seed, sampling=sampling, **kw)
    keep = through_stop(out, stops)
    assert keep[row].sum() <= 2, "the forced stop did not end its row early"
    assert (out[~keep] == policy.pad_token_id).all() and (lp[~keep] == 0).all()
    full = torch.cat([ids, out], 1)
    with torch.no_grad():
        expected = policy.token_logprobs(full, torch.cat([mask, keep.long()], 1), None, ids.shape[1], sampling[0])
    return {"recorded": lp[keep], "training": expected[keep], "out": out}


def test_one_rank_decodes_from_the_frozen_weights_own_storage(path, monkeypatch):
    """Sharded over one rank as the trainer shards it (bf16 weights, float32 LoRA adapters, computing in bf16), the
    decoder reads each frozen bf16 weight where it lay before sharding, not a gathered copy (`fsdp.shard` leaves
    them unmanaged there), and samples the tokens and log-probs of the unsharded model with its adapters in bf16,
    bit for bit."""
    policy = qwen3.load(ModelConfig(arch="qwen3", path=path, dtype="bfloat16"))
    net = policy.transformer
    adapt(net, 0)
    world = dist.init()
    net.to(world.device)  # where sharding puts it
    unsharded = copy.deepcopy(net)
    for p in unsharded.parameters():  # what FSDP's mixed precision computes (buffers stay as they are)
        p.data = p.data.to(torch.bfloat16)
    down = net.model.layers[0].mlp.down_proj  # a frozen weight the decoder reads through its module
    storage = down.weight.data_ptr()
    fsdp.shard(net, list(net.model.layers), fsdp.mesh(world), torch.bfloat16)
    assert isinstance(net.model.layers[0].self_attn.q_proj.lora_A.default.weight, DTensor)  # trained: FSDP's
    read = []
    write = decode.write_decode_attention  # each decode step's, on the CPU and on CUDA
    monkeypatch.setattr(decode, "write_decode_attention", lambda *a: read.append(down.weight.data_ptr()) or write(*a))
    ids, mask = (t.to(world.device) for t in prompts(policy))
    outputs = []
    for network in (net, unsharded):
        torch.manual_seed(0)
        outputs.append(decode.generate(network, ids, mask, policy.stop_token_ids, policy.pad_token_id, 8, *SAMPLING))
    assert read and set(read[: len(read) // 2]) == {storage}
    (a, lp_a), (b, lp_b) = outputs
    assert torch.equal(a, b) and torch.equal(lp_a, lp_b)


def test_running_out_of_memory_gathering_the_weights_names_the_fix(policy, monkeypatch):
    """Where the gathered text stack does not fit beside its shards (the 30B-A3B thinker's on one 80 GB card before
    frozen weights stayed unmanaged over one rank), the decoder's error gives the stack's size and
    `generation.decoder=transformers`, and the units gathered so far are sharded again."""
    net = policy.transformer
    fsdp.shard(net.float(), list(net.model.layers), fsdp.mesh(dist.init()), torch.float32)  # all trained: FSDP's
    units = [u for u in net.modules() if isinstance(u, FSDPModule)]
    gathered = []

    def unshard(self, async_op=False):
        if len(gathered) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 384.00 MiB.")
        gathered.append(self)
        return original(self, async_op)

    original = FSDPModule.unshard
    monkeypatch.setattr(FSDPModule, "unshard", unshard)
    size = sum(p.numel() * 4 for p in net.model.parameters()) / 2**30
    ids, mask = prompts(policy)
    with pytest.raises(torch.OutOfMemoryError, match=rf"\({size:.1f} GiB\).*generation.decoder=transformers"):
        decode.generate(net, ids, mask, policy.stop_token_ids, policy.pad_token_id, 4)
    assert len(gathered) == 2 and all(isinstance(p, DTensor) for u in units for p in u.parameters())


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.8), (7, 0.6)])
def test_filters_equal_transformers_warpers(top_k, top_p):
    scores = torch.randn(4, 50) * 3
    expected = scores
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(decode.filtered(scores, top_k, top_p), expected)


def test_greedy_tokens_and_log_probs_equal_transformers_generate(policy):
    ids, mask = prompts(policy)
    expected, expected_lp = policy.generate(ids, mask, None, {"max_new_tokens": 12, "do_sample": False})
    out, lp = decode.generate(policy.transformer, ids, mask, policy.stop_token_ids, policy.pad_token_id, 12,
                              greedy=True)  # fmt: skip
    width = expected.shape[1]
    assert torch.equal(out[:, :width], expected) and (out[:, width:] == policy.pad_token_id).all()
    torch.testing.assert_close(lp[:, :width], expected_lp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("decoder", ["static", "transformers"])
@pytest.mark.parametrize("adapter", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_log_probs_equal_the_training_forward(policy, decoder, adapter, seed):
    """Sampling at temperature 0.7 with top-k and top-p: the recorded log-probs are the training forward's
    (logits / temperature, before the filters) through each row's stop token, with and without a LoRA adapter."""
    if adapter:
        adapt(policy.transformer, seed)
    result = check_against_training(policy, decoder, seed)
    torch.testing.assert_close(result["recorded"], result["training"], atol=1e-5, rtol=0)
    if adapter:  # the adapter changed what is sampled
        with lora.adapters_disabled(policy.transformer):
            plain = check_against_training(policy, decoder, seed)
        assert not torch.equal(plain["out"], result["out"])


def test_merged_lora_samples_as_the_adapted_modules(policy):
    """With LoRA on all seven projections of every layer, `merge_lora` (the default) runs no adapter module at any
    token, samples the same tokens as the adapters applied through peft, records the training forward's log-probs
    within float32 rounding, and leaves every weight of the network as it was; with the adapters off, the stacked
    weights are the base layers' own."""
    net = policy.transformer
    adapt(net, 3, qwen3.ATTENTION + ["gate_proj", "up_proj", "down_proj"])
    layer = net.model.layers[0]
    with lora.adapters_disabled(net):
        plain = decode.merged_weights(net)[0]
        attn, mlp = layer.self_attn, layer.mlp
        assert torch.equal(plain["qkv"][0], torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        assert torch.equal(plain["gate_up"][0], torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        assert plain["o_proj"][0] is attn.o_proj.base_layer.weight and plain["qkv"][1] is None
    merged = decode.merged_weights(net)[0]
    delta = layer.self_attn.k_proj.get_delta_weight("default")
    q_rows = layer.self_attn.q_proj.out_features
    k_rows = slice(q_rows, q_rows + layer.self_attn.k_proj.out_features)
    torch.testing.assert_close(merged["qkv"][0][k_rows], layer.self_attn.k_proj.weight + delta)
    assert not torch.equal(merged["down_proj"][0], layer.mlp.down_proj.weight)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    calls = []
    hooks = [
        layer.lora_A["default"].register_forward_hook(lambda *a: calls.append(1)) for layer in lora.lora_layers(net)
    ]
    ids, mask = prompts(policy)
    outputs = {}
    for merge in (True, False):
        calls.clear()
        torch.manual_seed(5)
        outputs[merge] = decode.generate(net, ids, mask, policy.stop_token_ids, policy.pad_token_id, 12, 0.8,
                                         merge_lora=merge)  # fmt: skip
        assert (len(calls) == 0) == merge, (merge, len(calls))
    for h in hooks:
        h.remove()
    assert torch.equal(outputs[True][0], outputs[False][0])
    torch.testing.assert_close(outputs[True][1], outputs[False][1], atol=1e-5, rtol=0)
    result = check_against_training(policy, "static", 1)
    torch.testing.assert_close(result["recorded"], result["training"], atol=1e-5, rtol=0)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_rows_stop_at_their_stop_token(policy):
    """A stop token ends its row (padding after it) and generation ends once every row has stopped."""
    ids, mask = prompts(policy)
    first, _ = decode.generate(policy.transformer, ids, mask, [], policy.pad_token_id, 3, greedy=True)
    stop = int(first[0, 1])  # row 0's second greedy token, made a stop token
    out, lp = decode.generate(policy.transformer, ids, mask, [stop], policy.pad_token_id, 40, greedy=True)
    assert out[0, 1] == stop and (out[0, 2:] == policy.pad_token_id).all() and (lp[0, 2:] == 0).all()
    assert out.shape[1] <= 40


def test_heads_run_in_float32(path):
    """Both decoders compute the output head in float32 from a bf16 network, as training does. With logits of a
    realistic range (the final norm scaled x8) a bf16 head recorded log-probs 4.4e-3 nats off the training forward's
    on average (1.1e-2 at most) on this CPU; now the static decoder agrees within float32 rounding, and transformers'
    `generate`, whose cached attention rounds differently in bf16, within 1.5e-3 on average."""
    for decoder, mean, most in (("static", 1e-5, 1e-5), ("transformers", 1.5e-3, 2e-2)):
        policy = qwen3.load(ModelConfig(arch="qwen3", path=path, dtype="bfloat16"))
        with torch.no_grad():
            policy.transformer.model.norm.weight.mul_(8)
        gap = torch.cat([(r["recorded"] - r["training"]).abs()
                         for r in (check_against_training(policy, decoder, s) for s in (0, 1, 2))])  # fmt: skip
        assert gap.mean() < mean and gap.max() < most, (decoder, float(gap.mean()), float(gap.max()))


# The attention kernels SDPA may pick: PyTorch's default choice (the recipes'; cuDNN where it takes the call, which
# it does not for the static decoder's grouped decode step), without cuDNN, and math alone.
KERNELS = {"default": None, "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], "math": [SDPBackend.MATH]}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("decoder, graph, adapter", [
    (decoder, graph, adapter) for decoder, graph in (("static", False), ("static", True), ("transformers", False))
    for adapter in (None, "lora", "lora_unmerged") if decoder == "static" or adapter != "lora_unmerged"])  # fmt: skip
def test_on_cuda(path, dtype, decoder, graph, adapter):
    """The decoders on CUDA, eager and graph, without LoRA and with it (the static decoder by merged weights, or
    through peft's modules as `lora_unmerged` and transformers' `generate`), under each choice of attention kernels,
    in float32 and in bf16 with realistic logits (the final norm scaled x8, where a bf16 head was off by 4e-3 nats on
    average on the CPU): the recorded log-probs through each stop token are the training forward's within float32
    rounding (1e-6 at most on an H200), but for the static decoder in bf16 without cuDNN or with merged LoRA weights:
    its prefill's grouped attention then takes another kernel than the training forward's (2e-3 to 4e-3 nats on
    average), and a merged weight W + s·B·A is rounded to bf16 where training adds the adapter's output to W's (1.0e-2
    nats on average with this adapter, whose B·A is as large as W, on an H200; the bound is the 0.042 nats the bf16
    graph decoder already records on Qwen3-8B without adapters, which the bf16 replay of `auto` covers); the language
    recipes keep the default kernels."""
    for name, kernels in KERNELS.items():
        policy = qwen3.load(ModelConfig(arch="qwen3", path=path, dtype=dtype))
        if adapter:
            adapt(policy.transformer, 0)
        with torch.no_grad():
            policy.transformer.model.norm.weight.mul_(8 if dtype == "bfloat16" else 1)
        policy.transformer.cuda()
        kw = {"graph": graph, "merge_lora": adapter == "lora"} if decoder == "static" else {}
        with sdpa_kernel(kernels) if kernels else nullcontext():
            results = [check_against_training(policy, decoder, seed, "cuda", **kw) for seed in (0, 1, 2)]
        gap = torch.cat([(r["recorded"] - r["training"]).abs() for r in results])
        print(f"{dtype} {decoder} graph={graph} adapter={adapter} {name}: gap {gap.mean():.2e} max {gap.max():.2e}")
        if dtype == "bfloat16" and decoder == "static" and adapter == "lora":
            assert gap.mean() < 4.2e-2, (name, float(gap.mean()), float(gap.max()))
        elif dtype == "bfloat16" and decoder == "static" and kernels:
            assert gap.mean() < 1e-2, (name, float(gap.mean()), float(gap.max()))
        else:
            assert gap.max() < 1e-4, (name, float(gap.mean()), float(gap.max()))


def flash_step(q, k, v, caches: list[torch.Tensor], visible: torch.Tensor, slot: int,
               tiles: tuple) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """`flash_decode.attention`'s output in float32 for new keys/values k/v at `slot` of views (one slot shorter) of
    fresh copies of `caches`, and SDPA's over the slots through `slot` of the caches written by indexing; the
    kernel's own writes are checked equal to indexing's."""
    from omnialign.rollout import flash_decode

    length, slots = caches[0].shape[2] - 1, torch.tensor([slot], device="cuda")
    keys, values = (c.clone()[:, :, :length] for c in caches)
    out = flash_decode.attention(q, k, v, keys, values, slots, visible, q.shape[-1] ** -0.5, *tiles)
    written = [c[:, :, :length].index_copy(2, slots, new) for c, new in zip(caches, (k, v))]
    assert torch.equal(keys, written[0]) and torch.equal(values, written[1]), "the cache write"
    reached = visible & (torch.arange(length, device="cuda") <= slot)
    return out.float(), decode.decode_attention(q.float(), *(w.float() for w in written), reached, q.shape[-1] ** -0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_decode_attention_equals_sdpa(dtype):
    """The decode step's Triton cache write and attention on CUDA (`flash_decode.attention`) against the cache written
    by indexing and SDPA's attention (`decode_attention`, in float32) over the head widths of the tiny twins (8, 12)
    and of the real models (128), 1 to 8 query rows a key/value head, slots in several splits, in one, and in a split
    ending past the cache, with rows left-padded by different amounts and one with holes, the caches views of longer
    ones as in the decoder; the mask counts, and no slot after the step's own is read (splits wholly after it too).
    `write_attention`: the same, its splits chosen for the card."""
    from omnialign.rollout import flash_decode

    g = torch.Generator().manual_seed(0)
    cases = ((3, 2, 4, 128, 150, 64, 32), (3, 1, 2, 8, 150, 32, 32), (2, 2, 8, 12, 130, 256, 64),
             (4, 2, 1, 128, 384, 512, 64))  # fmt: skip
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # float32: within its rounding (2.9e-6 at most on an H100)
    for batch, heads, groups, dim, length, chunk, block in cases:
        q, k, v = (torch.randn(batch, heads, n, dim, generator=g).to("cuda", dtype) for n in (groups, 1, 1))
        caches = [torch.randn(batch, heads, length + 1, dim, generator=g).to("cuda", dtype) for _ in "kv"]
        seen = torch.ones(batch, length, dtype=torch.bool)
        for b in range(batch):
            seen[b, : (b * 37) % (length // 2)] = False
        seen[1] = torch.rand(length, generator=g) < 0.5
        visible = seen[:, None, None].cuda()
        new, tiles = (q, k, v, caches), (chunk, block, 2, 2)
        out, expected = flash_step(*new, visible, length - 1, tiles)
        torch.testing.assert_close(out, expected, atol=tolerance, rtol=0)
        assert (flash_step(*new, visible | True, length - 1, tiles)[0] - expected).abs().max() > 0.1  # the mask counts
        torch.testing.assert_close(*flash_step(*new, visible | True, length // 3, tiles), atol=tolerance, rtol=0)
    keys, values = torch.zeros(2, 2, 9, 8, device="cuda"), torch.zeros(2, 2, 9, 8, device="cuda")
    k, v = torch.randn(2, 2, 1, 8, device="cuda"), torch.randn(2, 2, 1, 8, device="cuda")
    visible = torch.zeros(2, 1, 1, 9, dtype=torch.bool, device="cuda")
    visible[..., [5, 7]] = True  # slot 7, after the step's own, is not read
    values[:, :, 7] = 100.0
    out = flash_decode.write_attention(torch.randn(2, 2, 4, 8, device="cuda"), k, v, keys, values,
                                       torch.tensor([5], device="cuda"), visible, 1.0)  # fmt: skip
    assert torch.equal(keys[:, :, 5:6], k) and torch.equal(values[:, :, 5:6], v) and keys[:, :, :5].eq(0).all()
    torch.testing.assert_close(out, v.expand(-1, -1, 4, -1))  # the one visible slot: its value


@pytest.mark.gpu
def test_fused_draw_samples_the_softmax_and_records_the_training_log_probs(policy):
    """`fused_sample.draw`, the decode step's draw on CUDA without top-k or top-p: the drawn tokens' log-probs are log
    softmax(logits / temperature)'s in float64 within float32 rounding over Qwen3's vocabulary, a -inf (banned)
    token is never drawn, 200,000 draws from five tokens follow the softmax, and a seed repeats the draws whatever
    the parts a row is read in; through the static decoder the recorded log-probs are the training forward's."""
    from omnialign.rollout import fused_sample

    logits = (torch.randn(64, 151_936, generator=torch.Generator().manual_seed(0)) * 4).cuda()
    logits[:, ::7] = float("-inf")
    for temperature in (1.0, 0.7):
        tokens, logps = fused_sample.draw(logits, temperature)
        exact = (logits.double() / temperature).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
        torch.testing.assert_close(logps.double(), exact, atol=1e-5, rtol=0)  # 7.7e-7 in Triton's interpreter
        assert (tokens % 7 != 0).all()
    few = torch.tensor([0.0, 1.0, 2.0, -1.0, float("-inf")], device="cuda").repeat(200_000, 1)
    torch.manual_seed(0)
    tokens, _ = fused_sample.draw(few, 1.0)
    share = torch.bincount(tokens, minlength=5).double() / len(tokens)
    expected = few[0].double().softmax(-1)
    assert ((share - expected).abs() <= 5 * (expected * (1 - expected) / len(tokens)).sqrt()).all(), share
    torch.manual_seed(0)
    assert torch.equal(fused_sample.draw(few, 1.0)[0], tokens)
    assert not torch.equal(fused_sample.draw(few, 1.0)[0], tokens)
    draws = []
    for chunk in (75 * fused_sample.BLOCK, 16 * fused_sample.BLOCK, fused_sample.BLOCK):  # a row in 1, 5, 75 parts
        torch.manual_seed(1)
        draws.append(fused_sample.draw(logits, 0.7, chunk))
    for tokens, logps in draws[1:]:  # the same tokens; the sums in another order
        assert torch.equal(tokens, draws[0][0])
        torch.testing.assert_close(logps, draws[0][1], atol=1e-5, rtol=0)
    policy.transformer.cuda()
    results = [check_against_training(policy, "static", seed, "cuda", sampling=(0.7, 0, 1.0)) for seed in (0, 1, 2)]
    gap = torch.cat([(r["recorded"] - r["training"]).abs() for r in results])
    print(f"fused draw: gap {gap.mean():.2e} max {gap.max():.2e}")
    assert gap.max() < 1e-4, (float(gap.mean()), float(gap.max()))


@pytest.mark.gpu
def test_cuda_graph_replay_equals_the_eager_step(policy):
    net = policy.transformer.cuda()
    ids, mask = (t.cuda() for t in prompts(policy))
    args = (net, ids, mask, policy.stop_token_ids, policy.pad_token_id, 16, 0.8, 0, 1.0)
    outputs = []
    for graph in (False, True):
        torch.manual_seed(1)
        outputs.append(decode.generate(*args, graph=graph))
    assert torch.equal(outputs[0][0], outputs[1][0])
    torch.testing.assert_close(outputs[0][1], outputs[1][1], atol=0, rtol=0)
    net.cpu()


def generates_alike(policy, device, monkeypatch, name: str, variants: tuple, tokens: int, atol: float) -> None:
    """decode.generate on the prompts at seed 1 (temperature 0.8) with decode's `name` set to each of two variants:
    the same responses, log-probs within atol."""
    net = policy.transformer.to(device)
    ids, mask = (t.to(device) for t in prompts(policy))
    outputs = []
    for variant in variants:
        monkeypatch.setattr(decode, name, variant)
        torch._dynamo.reset()
        torch.manual_seed(1)
        outputs.append(decode.generate(net, ids, mask, policy.stop_token_ids, policy.pad_token_id, tokens, 0.8))
    assert torch.equal(outputs[0][0], outputs[1][0])
    torch.testing.assert_close(outputs[0][1], outputs[1][1], atol=atol, rtol=0)
    net.cpu()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_attention_reach_grows_by_buckets(policy, device, monkeypatch):
    """A decode step attends only to the cache's first multiple of `decode.BUCKET` slots that holds its own: with
    buckets of 4 slots (on a GPU a graph captured for each) the tokens and log-probs are those of steps that attend to
    the whole cache."""
    generates_alike(policy, device, monkeypatch, "BUCKET", (4, 10_000), tokens=20, atol=1e-6)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compiled_step_samples_as_the_eager_step(policy, device, monkeypatch):
    """`compiled=True` (the decode step through torch.compile, then captured as a graph on a GPU) samples the eager
    step's tokens with its log-probs within float32 rounding, for several cache lengths, attention reaches (buckets of
    4 slots) and batch sizes from one compilation, and with merged LoRA weights."""
    monkeypatch.setattr(decode, "BUCKET", 4)
    net = policy.transformer.to(device)
    ids, mask = (t.to(device) for t in prompts(policy))
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for tokens, rows, adapter in ((4, 3, False), (12, 3, False), (12, 2, False), (12, 3, True)):
        if adapter:
            assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1
            adapt(net.cpu(), 0)
            net.to(device)
        outputs = []
        for compiled in (False, True):
            torch.manual_seed(1)
            outputs.append(decode.generate(net, ids[:rows], mask[:rows], policy.stop_token_ids, policy.pad_token_id,
                                           tokens, 0.8, compiled=compiled))  # fmt: skip
        assert torch.equal(outputs[0][0], outputs[1][0])
        torch.testing.assert_close(outputs[0][1], outputs[1][1], atol=1e-5, rtol=0)
    net.cpu()


@pytest.mark.gpu
def test_compiled_step_in_bf16_on_cuda(path):
    """The compiled step of a bf16 network (the decode benchmark's setting: the head through `qwen3.head_logits`
    inside the compiled graph) with realistic logits: the recorded log-probs through each stop token are the training
    forward's within the bf16 tolerance of `test_on_cuda` (the compiled graph fuses and rounds differently)."""
    policy = qwen3.load(ModelConfig(arch="qwen3", path=path, dtype="bfloat16"))
    with torch.no_grad():
        policy.transformer.model.norm.weight.mul_(8)
    policy.transformer.cuda()
    results = [check_against_training(policy, "static", seed, "cuda", compiled=True) for seed in (0, 1, 2)]
    gap = torch.cat([(r["recorded"] - r["training"]).abs() for r in results])
    print(f"bf16 compiled step: gap {gap.mean():.2e} max {gap.max():.2e}")
    assert gap.mean() < 1e-2, (float(gap.mean()), float(gap.max()))
