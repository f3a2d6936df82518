"""The static-cache decoder (rollout/decode.py) against transformers on the tiny Qwen3 twin: the same greedy
tokens, the same sampling filters, log-probs equal to the training forward's, LoRA adapters applied, and (on a
GPU) the CUDA-graph replay equal to the eager step."""

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from omnialign.config import ModelConfig
from omnialign.models import lora, qwen3, tiny
from omnialign.rollout import decode
from omnialign.rollout.language import left_pad


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


@pytest.mark.parametrize("adapter", [False, True])
def test_sampled_log_probs_equal_the_training_forward(policy, adapter):
    """Sampling at temperature 0.7 with top-k and top-p: the recorded log-probs are the training forward's
    (logits / temperature, before the filters), with and without a LoRA adapter (its B moved off zero)."""
    net = policy.transformer
    if adapter:
        lora.apply_lora(net, 4, 4, qwen3.ATTENTION)
        with torch.no_grad():
            for name, p in net.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
    ids, mask = prompts(policy)
    torch.manual_seed(0)
    out, lp = decode.generate(net, ids, mask, policy.stop_token_ids, policy.pad_token_id, 10, 0.7, 20, 0.9)
    keep = torch.ones_like(out, dtype=torch.bool).cumprod(1)  # every row runs 10 tokens here (no stop token)
    full = torch.cat([ids, out], 1)
    with torch.no_grad():
        expected = policy.token_logprobs(full, torch.cat([mask, keep.long()], 1), None, ids.shape[1], 0.7)
    torch.testing.assert_close(lp, expected, atol=1e-5, rtol=0)
    torch.manual_seed(0)
    again, _ = decode.generate(net, ids, mask, policy.stop_token_ids, policy.pad_token_id, 10, 0.7, 20, 0.9)
    assert torch.equal(again, out)
    if adapter:
        with lora.adapters_disabled(net):
            torch.manual_seed(0)
            plain, _ = decode.generate(net, ids, mask, policy.stop_token_ids, policy.pad_token_id, 10, 0.7, 20, 0.9)
        assert not torch.equal(plain, out)  # the adapter changed what is sampled


def test_rows_stop_at_their_stop_token(policy):
    """A stop token ends its row (padding after it) and generation ends once every row has stopped."""
    ids, mask = prompts(policy)
    first, _ = decode.generate(policy.transformer, ids, mask, [], policy.pad_token_id, 3, greedy=True)
    stop = int(first[0, 1])  # row 0's second greedy token, made a stop token
    out, _ = decode.generate(policy.transformer, ids, mask, [stop], policy.pad_token_id, 40, greedy=True)
    assert out[0, 1] == stop and (out[0, 2:] == policy.pad_token_id).all()
    assert out.shape[1] <= 40


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
