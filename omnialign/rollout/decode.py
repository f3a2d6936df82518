"""Fast sampling from a Qwen3-family causal LM: a static KV cache, one batched prefill, and a decode step captured
as a CUDA graph and replayed for every token (on a GPU; eager elsewhere). A step attends to the cache's first
multiple of BUCKET slots that holds its own, so early tokens of a long generation do not read the empty tail (on a
GPU the attention kernel reads no slot after the step's own in any case); one graph is captured per such reach.
The Qwen3-Omni thinker's layers are the same but for their routed experts, which a step runs as their own module;
its prompts (media, 3-D rotary positions) come prefilled by its own forward (`Prefill`), and its decode steps rotate
at the positions past them.

transformers' `generate` re-enters Python for every layer of every token and grows its cache, which leaves an H200
far below its memory bandwidth at batch 128 (BENCHMARKS.md, "Language decoding"). Here a token costs one graph
replay, a sampling kernel and a few small ones. By default (`merge_lora`) a layer's seven projections run as four
GEMMs by copies of their weights made once per generation: q/k/v stacked into one, gate/up into another, each with
its active LoRA adapters folded in, W + s·B·A (the network's own weights are not touched), instead of seven base
GEMMs plus peft's cast, two small GEMMs, scale and add per adapted projection at every token. Without it the layers
run through the network's own modules. On a GPU a decode step's cache write and attention are one Triton operator
(`flash_decode`), which pads a key/value head's few query rows to 16 where SDPA's kernels pad them to 64 or 128. A
network sharded with FSDP2 is unsharded for the whole generation and resharded after (`readable`).

Sampling follows transformers: logits / temperature, then top-k, then top-p, then a multinomial draw from the
default generator (seed it as the rollout does); on a GPU without top-k or top-p one Triton kernel draws the token
by the Gumbel-max trick and computes its log-prob in one pass over the logits (`fused_sample`). The logits come from
the output head in float32, as training computes them (`qwen3.head_logprobs`; on a GPU one bf16 GEMM accumulating in
float32, `qwen3.head_logits`), and the recorded log-prob of each sampled token is log softmax(logits / temperature),
before top-k/top-p: so the rollout's log-probs are the training forward's up to the model dtype's rounding in the
layers. A row that produced a stop token continues with padding, whose recorded log-probs are 0; generation ends
when every row has stopped or at `max_new_tokens`.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from omnialign.models.base import Prefill
from omnialign.models.qwen3 import head_logits

CHECK_EVERY = 8  # tokens between the (host-syncing) checks whether every row has stopped
BUCKET = 128  # cache slots by which a decode step's attention grows


def merged_weights(net: nn.Module) -> list[dict[str, tuple[torch.Tensor, torch.Tensor | None]]]:
    """Per decoder layer, its projections as (weight, bias) pairs: "qkv" (q, k and v stacked), "o_proj", and for a
    dense MLP "gate_up" (gate and up stacked) and "down_proj", each projection with its active LoRA adapters folded
    in, W + s·B·A (summed in float32, kept in W's dtype). A projection without adapters contributes its own weight.
    A mixture of experts (the omni thinker's) has no entries: it runs as its own module."""

    def weight(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(m, LoraLayer):
            return m.weight, m.bias
        w, b = m.base_layer.weight, m.base_layer.bias
        if m.disable_adapters or m.merged:
            return w, b
        delta = sum(m.get_delta_weight(a).float() for a in m.active_adapters)
        return (w.float() + delta).to(w.dtype), b

    def stacked(*modules: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        pairs = [weight(m) for m in modules]
        biases = [b for _, b in pairs]
        return torch.cat([w for w, _ in pairs]), None if biases[0] is None else torch.cat(biases)

    def mlp(m: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        if hasattr(m, "experts"):  # a mixture of experts: routed, not four GEMMs
            return {}
        return {"gate_up": stacked(m.gate_proj, m.up_proj), "down_proj": weight(m.down_proj)}

    return [{"qkv": stacked(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
             "o_proj": weight(layer.self_attn.o_proj), **mlp(layer.mlp)}
            for layer in net.get_decoder().layers]  # fmt: skip


@contextmanager
def readable(net: nn.Module) -> Iterator[None]:
    """The weights the decode steps read (the text stack, its embeddings and the head; not media towers) whole, for
    the duration: a network sharded with FSDP2 is unsharded (each rank gathers what its units manage: over one rank
    only the trained weights, `fsdp.shard`) and resharded after, with what its last forward left unsharded (FSDP
    keeps the root's)."""
    units = [m for m in (net, *net.get_decoder().modules()) if isinstance(m, FSDPModule)]
    try:
        try:
            for unit in units:
                unit.unshard()
        except torch.OutOfMemoryError as error:
            size = sum(p.numel() * p.element_size() for p in net.get_decoder().parameters()) / 2**30
            raise torch.OutOfMemoryError(
                f"generation.decoder: omnialign's decoder holds the whole text stack unsharded ({size:.1f} GiB) "
                "beside its shards, more than this device has free; set generation.decoder=transformers "
                "(`generate` gathers one layer at a time)"
            ) from error
        yield
    finally:
        for unit in units:
            unit.reshard()


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                     scale: float) -> torch.Tensor:  # fmt: skip
    """A decode step's attention: the query heads sharing a key/value head are its query rows, so that each key and
    value is read once. q (B, KV, G, D), k/v (B, KV, L, D), visible (B, 1, 1, L) -> (B, KV, G, D)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def write_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                           values: torch.Tensor, slots: torch.Tensor, visible: torch.Tensor,
                           scale: float) -> torch.Tensor:  # fmt: skip
    """A decode step's cache write, k/v (B, KV, 1, D) into slot `slots` of keys/values (B, KV, L, D), and its
    `decode_attention` of q (B, KV, G, D) -> (B, KV, G, D). On a GPU both are one Triton operator
    (`flash_decode.write_attention`)."""
    if q.is_cuda:
        from omnialign.rollout import flash_decode  # Triton: CUDA builds of torch only

        return flash_decode.write_attention(q, k, v, keys, values, slots, visible, scale)
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v)
    return decode_attention(q, keys, values, visible, scale)


def _forward(net: nn.Module, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, visible: torch.Tensor,
             keys: list[torch.Tensor], values: list[torch.Tensor],
             merged: list[dict[str, tuple[torch.Tensor, torch.Tensor | None]]] | None) -> torch.Tensor:  # fmt: skip
    """Float32 logits (B, V) of the last of T new tokens.

    ids: (B, T) new tokens; positions: their rotary position ids, (B, T) or (3, B, T) for M-RoPE; slots: (T,) cache
    slots they are written to; visible: (B, 1, T, L) which cache slots each new token attends to; keys/values: per
    layer (B, KV, L, D); merged: per layer, the GEMMs' weights of `merged_weights` (None: the network's own
    modules)."""
    model = net.get_decoder()
    x = model.embed_tokens(ids)
    rope = model.rotary_emb(x, positions)
    batch, length = ids.shape
    head_dim = model.layers[0].self_attn.head_dim
    q_width, kv_width = model.config.num_attention_heads * head_dim, model.config.num_key_value_heads * head_dim
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        h = layer.input_layernorm(x)
        heads = (batch, length, -1, attn.head_dim)
        if merged is None:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        else:
            q, k, v = F.linear(h, *merged[i]["qkv"]).split([q_width, kv_width, kv_width], -1)
        q = attn.q_norm(q.view(heads)).transpose(1, 2)
        k = attn.k_norm(k.view(heads)).transpose(1, 2)
        v = v.view(heads).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rope)
        k, v = k.to(keys[i].dtype), v.to(values[i].dtype)
        if length == 1:
            o = write_decode_attention(q.reshape(batch, keys[i].shape[1], -1, attn.head_dim), k, v, keys[i],
                                       values[i], slots, visible, attn.scaling)  # fmt: skip
        else:
            keys[i].index_copy_(2, slots, k)
            values[i].index_copy_(2, slots, v)
            o = F.scaled_dot_product_attention(q, keys[i], values[i], attn_mask=visible, scale=attn.scaling,
                                               enable_gqa=True).transpose(1, 2)  # fmt: skip
        o = o.reshape(batch, length, -1)
        x = x + (attn.o_proj(o) if merged is None else F.linear(o, *merged[i]["o_proj"]))
        h = layer.post_attention_layernorm(x)
        if merged is None or "gate_up" not in merged[i]:
            x = x + mlp(h)
        else:
            gate, up = F.linear(h, *merged[i]["gate_up"]).chunk(2, -1)
            x = x + F.linear(mlp.act_fn(gate) * up, *merged[i]["down_proj"])
    return head_logits(model.norm(x[:, -1]), net.get_output_embeddings().weight)


def filtered(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature-scaled scores (B, V) with the tokens outside the top k, then outside the nucleus of mass
    top_p, set to -inf (transformers' TopKLogitsWarper and TopPLogitsWarper; the most likely token stays)."""
    if top_k > 0:
        kth = scores.topk(min(top_k, scores.shape[-1]), -1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:  # drop the tokens whose cumulative probability, from the least likely up, is <= 1 - top_p
        ordered, order = scores.sort(-1)
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, greedy: bool) -> tuple:
    """(B,) next tokens and their log-probs log softmax(logits / temperature) from float32 logits (B, V). On a GPU
    without top-k or top-p both come from one Triton kernel (`fused_sample.draw`, the Gumbel-max trick)."""
    if logits.is_cuda and not greedy and top_k == 0 and top_p == 1.0:
        from omnialign.rollout import fused_sample  # Triton: CUDA builds of torch only

        return fused_sample.draw(logits, temperature)
    scores = logits / temperature
    if greedy:
        token = logits.argmax(-1)
    else:
        token = torch.multinomial(filtered(scores, top_k, top_p).softmax(-1), 1).squeeze(-1)
    return token, scores.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)


@torch.no_grad()
def generate(net: nn.Module, ids: torch.Tensor, mask: torch.Tensor, stop_ids: list[int], pad_id: int,
             max_new_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
             graph: bool | None = None, compiled: bool = False, merge_lora: bool = True, banned: list[int] = (),
             prefill: Prefill | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Responses (B, R <= max_new_tokens) to left-padded prompts ids/mask (B, P), padded after their stop token,
    and the float32 log-probs (B, R) of the sampled tokens (0 after the stop token). `graph`: replay the decode step
    as a CUDA graph (default: on a CUDA device). `compiled`: the decode step through `torch.compile` (before the
    capture), which fuses each layer's norms, rotary embedding and residuals (`generation.decoder=compiled`).
    `merge_lora`: each layer's projections as four GEMMs by stacked copies of their weights with the LoRA adapters
    folded in (`merged_weights`; `generation.merge_lora`), else through the network's modules. `banned`: token ids
    never sampled, with no mass in the recorded log-probs (the training forward's `head_logprobs(banned=...)`).
    `prefill`: the prompts already run through the network's own forward (`LanguagePolicy.prefill`: the omni
    thinker's media and 3-D positions), else the decoder runs them."""
    device, (batch, width) = ids.device, ids.shape
    graph = device.type == "cuda" if graph is None else graph
    model = net.get_decoder()
    with readable(net):
        attn = model.layers[0].self_attn
        length = width + max_new_tokens
        # one slot more than is filled, so that every step's view of the cache (below) is strided alike and one
        # compilation serves them all (a view of the whole cache would be contiguous, the others not)
        capacity = length + 1
        dtype = model.embed_tokens.weight.dtype
        shape = (batch, model.config.num_key_value_heads, capacity, attn.head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.layers]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.layers]
        # Which slots a token may attend to: the real prompt tokens, then each generated one from its step on.
        # A padding position sees itself too, so that no attention row is empty.
        seen = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        seen[:, :width] = mask.bool()
        merged = merged_weights(net) if merge_lora else None
        if prefill is None:
            causal = torch.ones(width, capacity, dtype=torch.bool, device=device).tril()
            visible = (causal & seen[:, None]) | torch.eye(width, capacity, dtype=torch.bool, device=device)
            positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
            slots = torch.arange(width, device=device)
            logits = _forward(net, ids, positions, slots, visible[:, None], keys, values, merged)
            position = positions[:, -1:] + 1
        else:
            logits, position = prefill.logits, prefill.position.clone()
            for buffers, parts in ((keys, prefill.keys), (values, prefill.values)):
                for buffer, part in zip(buffers, parts):
                    buffer[:, :, :width].copy_(part)
                parts.clear()  # the prefill's cache is not needed twice
        ban = torch.tensor(banned, dtype=torch.long, device=device)

        # The decode step reads and writes only these buffers, so it can be captured and replayed. It attends to the
        # cache's first `reach` slots, the first multiple of BUCKET that holds its own (all of them at most): one
        # graph per reach, each captured when first needed, so that early tokens do not read the empty tail.
        token_in = torch.zeros(batch, 1, dtype=torch.long, device=device)
        slot = torch.full((1,), width, dtype=torch.long, device=device)
        forward = _forward
        if compiled:
            # One compilation serves every batch size and reach (dynamo caches it on _forward's code): those two
            # dimensions alone are marked symbolic. `dynamic=True` made every input's dimensions symbolic, the
            # weights' too, whose shape reasoning grew faster than the layer count (86 s against 31 s with these marks
            # for 8 layers under FSDP2 on a CPU; Qwen3-8B's 36 did not compile within 5 minutes on an H200).
            forward = torch.compile(_forward)
            for t in (token_in, position):
                torch._dynamo.maybe_mark_dynamic(t, t.dim() - 2)  # the batch ((3,) B, 1)
        steps, graphs = {}, {}
        # one memory pool for all graphs: the reach only grows, so they replay in the order they were captured
        pool = torch.cuda.graph_pool_handle() if graph else None

        def step(reach: int) -> torch.Tensor:
            if reach not in steps:  # views of the cache and of `seen`: the step sees the slots `seen` gains
                views = (
                    seen[:, None, None, :reach],
                    [k[:, :, :reach] for k in keys],
                    [v[:, :, :reach] for v in values],
                )
                if compiled:
                    for t, dims in ((views[0], [0, 3]), *((kv, [0, 2]) for kv in views[1] + views[2])):
                        torch._dynamo.maybe_mark_dynamic(t, dims)
                steps[reach] = views
            visible_step, keys_step, values_step = steps[reach]
            seen.index_fill_(1, slot, True)
            return forward(net, token_in, position, slot, visible_step, keys_step, values_step, merged)

        def replay(reach: int) -> torch.Tensor:
            if reach not in graphs:
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    step(reach)  # warm-up: kernels choose their algorithms outside the capture (the same writes)
                torch.cuda.current_stream(device).wait_stream(side)
                captured = torch.cuda.CUDAGraph()
                with torch.cuda.graph(captured, pool=pool):
                    graphs[reach] = (captured, step(reach))
            captured, out = graphs[reach]
            captured.replay()
            return out

        stops = torch.tensor(stop_ids, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens, logps = [], []
        for t in range(max_new_tokens):
            if banned:
                logits.index_fill_(1, ban, float("-inf"))  # the step's own output, rewritten by the next
            token, logp = sample(logits, temperature, top_k, top_p, greedy)
            tokens.append(token.masked_fill(done, pad_id))
            logps.append(logp.masked_fill(done, 0.0))
            done |= torch.isin(tokens[-1], stops)
            if t + 1 == max_new_tokens or ((t + 1) % CHECK_EVERY == 0 and bool(done.all())):
                break
            token_in.copy_(tokens[-1][:, None])
            reach = min(length, -(-(width + t + 1) // BUCKET) * BUCKET)  # this step's slot, width + t, within reach
            logits = replay(reach) if graph else step(reach)
            position += 1
            slot += 1
        return torch.stack(tokens, 1), torch.stack(logps, 1)
