"""Plain Qwen3 causal LM as a `LanguagePolicy`, and the code every transformers language adapter shares.

`CausalLMPolicy` holds the trained network (`transformer`), its tokenizer and the token ids that end
a response. `token_logprobs` runs the network once with its output head replaced by `head_logprobs`: float32 logits
(`head_logits`), a chunk of positions at a time (recomputed in backward), so the (B, T, V) float32 logits never exist at
once, and inside the forward, where a sharded network's head weights are gathered.
`generate` wraps transformers' `generate` with a float32 head too (`head_logits`, at the last position, the only
one it reads) and records the sampling log-prob of every generated token from those logits (before top-k/top-p),
divided by the temperature as training does; 0 after a row's stop token.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

from omnialign.config import ModelConfig
from omnialign.models.base import Prefill

CHUNK = 256  # positions per float32 head chunk
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in float32 for 2-D a, b of one low-precision dtype: on a GPU one tensor-core GEMM that accumulates and
    returns float32, elsewhere the float32 GEMM of upcast copies. The products of two bf16 (or fp16) numbers are
    exact in float32, so the two agree up to the order of summation."""
    return torch.mm(a, b, out_dtype=torch.float32) if a.is_cuda else a.float() @ b.float()


class _LowPrecisionHead(torch.autograd.Function):
    """Float32 logits hidden @ weight^T of bf16 (or fp16) hidden (N, H) and weight (V, H) through `_mm32`. Backward
    splits the float32 gradient g of the logits into two parts of the operands' dtype, g = hi + lo to 16 significant
    bits, so that its GEMMs run the same way; the gradients are rounded to the operands' dtype as an upcast GEMM's
    are."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(hidden, weight)
        return _mm32(hidden, weight.T)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        hidden, weight = ctx.saved_tensors
        hi = grad.to(hidden.dtype)
        lo = (grad - hi.float()).to(hidden.dtype)
        d_hidden = (_mm32(hi, weight) + _mm32(lo, weight)).to(hidden.dtype) if ctx.needs_input_grad[0] else None
        d_weight = (_mm32(hi.T, hidden) + _mm32(lo.T, hidden)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return d_hidden, d_weight


def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Float32 logits hidden @ weight^T, hidden (..., H), weight (V, H) of the same dtype, with their gradients.

    A bf16 (or fp16) pair runs through `_mm32`, on a GPU as tensor-core GEMMs accumulating in float32 (forward and
    backward), instead of float32 GEMMs of upcast copies off the tensor cores (160 GFLOP a decode step for Qwen3-8B
    at batch 128, 40 TFLOP for the 32,768 response tokens of a GSPO step) and without a float32 copy of the head
    (2.5 GB for Qwen3-8B). A float32 model's head is the float32 GEMM."""
    if hidden.dtype == torch.float32:
        return hidden @ weight.float().T
    flat = _LowPrecisionHead.apply(hidden.reshape(-1, hidden.shape[-1]), weight)
    return flat.view(*hidden.shape[:-1], weight.shape[0])


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk: int = CHUNK,
    banned: list[int] = (),
) -> torch.Tensor:
    """log softmax(hidden @ weight^T / temperature) at `targets`, in float32; `banned` token ids get no mass.

    hidden: (B, L, H) final hidden states; weight: (V, H) output head; targets: (B, L) int64 -> (B, L).
    With grad enabled each chunk is recomputed in backward, so only one chunk's logits are alive.
    """

    def piece(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = head_logits(h, weight) / temperature
        if banned:
            logits[..., list(banned)] = float("-inf")
        return logits.gather(-1, t.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)

    parts = []
    for lo in range(0, targets.shape[1], chunk):
        h, t = hidden[:, lo : lo + chunk], targets[:, lo : lo + chunk]
        parts.append(checkpoint(piece, h, t, use_reentrant=False) if torch.is_grad_enabled() else piece(h, t))
    return torch.cat(parts, dim=1) if parts else hidden.new_zeros(targets.shape, dtype=torch.float32)


@contextmanager
def last_logits_head(net: nn.Module) -> Iterator[None]:
    """The network's output head replaced, for the block, by the float32 logits (`head_logits`) of the last position
    alone, (B, 1, V): inside the network's forward, where a sharded network's head weight is gathered."""
    head = net.get_output_embeddings()
    head.forward = lambda hidden: head_logits(hidden[:, -1], head.weight)[:, None]
    try:
        yield
    finally:
        del head.forward


class _LogProbRecorder(LogitsProcessor):
    """Keeps log softmax(raw logits / temperature) of each step and gathers it at the token sampled next."""

    def __init__(self, temperature: float):
        self.temperature, self.previous, self.taken = temperature, None, []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.taken.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def result(self, response: torch.Tensor) -> torch.Tensor:
        """(B, R) log-probs of the generated tokens (the last step gathered here)."""
        if self.previous is not None and len(self.taken) < response.shape[1]:
            self.taken.append(self.previous.gather(-1, response[:, len(self.taken) : len(self.taken) + 1]).squeeze(-1))
        return torch.stack(self.taken, dim=1) if self.taken else response.new_zeros(response.shape, dtype=torch.float)


class CausalLMPolicy:
    """`LanguagePolicy` over a transformers causal LM (Qwen3 and its relatives); text only."""

    lora_targets = ATTENTION
    frozen: list[nn.Module] = []
    banned_token_ids: list[int] = []
    """Token ids a response may not hold (media placeholders): suppressed in generation, no mass in log-probs."""

    def __init__(self, transformer: nn.Module, tokenizer):
        self.transformer, self.tokenizer = transformer, tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError(
                f"the tokenizer of {transformer.name_or_path} has no pad token: set pad_token in tokenizer_config.json"
            )
        self.pad_token_id = tokenizer.pad_token_id
        stop = transformer.generation_config.eos_token_id
        stop = [stop] if isinstance(stop, int) else list(stop or [])
        self.stop_token_ids = sorted({*stop, tokenizer.eos_token_id} - {None})

    def to(self, device: torch.device) -> "CausalLMPolicy":
        return self

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.model.layers)

    def encode(self, messages: list[list[dict]]) -> tuple[list[list[int]], list[dict | None]]:
        for i, conversation in enumerate(messages):
            for message in conversation:
                if not isinstance(message["content"], str):
                    kinds = [c["type"] for c in message["content"] if c["type"] != "text"]
                    if kinds:
                        raise ValueError(
                            f"prompt {i} holds {kinds} inputs but this model reads text only: "
                            "use model.arch=qwen3_omni or a text-only data set"
                        )
        texts = [self.tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
        return [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts], [None] * len(texts)

    def forward_inputs(self, ids: torch.Tensor, mask: torch.Tensor, media: list | None) -> dict:
        """Network inputs besides ids and mask: positions that skip the left padding (as generate uses)."""
        return {"position_ids": (mask.long().cumsum(-1) - 1).clamp_min(0)}

    def token_logprobs(
        self, ids: torch.Tensor, mask: torch.Tensor, media: list | None, start: int, temperature: float = 1.0
    ) -> torch.Tensor:
        if not 1 <= start < ids.shape[1]:
            raise ValueError(f"token_logprobs: start={start} must lie in [1, {ids.shape[1]})")
        # The head runs inside the network's forward (where a sharded network's weights are gathered): it
        # returns the log-probs of the next tokens in place of logits; the last position predicts nothing.
        head = self.transformer.get_output_embeddings()
        targets = nn.functional.pad(ids[:, start:], (0, 1))
        keep = ids.shape[1] - start + 1  # some networks (the omni thinker) ignore logits_to_keep: slice here too
        head.forward = lambda hidden: head_logprobs(hidden[:, -keep:], head.weight, targets, temperature,
                                                    banned=self.banned_token_ids)  # fmt: skip
        try:
            out = self.transformer(input_ids=ids, attention_mask=mask, **self.forward_inputs(ids, mask, media),
                                   logits_to_keep=keep, use_cache=False)  # fmt: skip
        finally:
            del head.forward
        return out.logits[:, :-1]

    def media_inputs(self, media: list | None, device: torch.device) -> dict:
        return {}

    def generating(self) -> AbstractContextManager:
        return nullcontext()

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, media: list | None) -> Prefill | None:
        return None  # text: the static decoder runs the prompts itself

    @torch.no_grad()
    def generate(
        self, ids: torch.Tensor, mask: torch.Tensor, media: list | None, options: dict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        recorder = _LogProbRecorder(options.get("temperature", 1.0))
        with last_logits_head(self.transformer):
            out = self.transformer.generate(
                input_ids=ids, attention_mask=mask, **self.media_inputs(media, ids.device), **options,
                eos_token_id=self.stop_token_ids, pad_token_id=self.pad_token_id, tokenizer=self.tokenizer,
                logits_processor=LogitsProcessorList([recorder]), use_cache=True, repetition_penalty=1.0,
                suppress_tokens=self.banned_token_ids or None,
            )  # fmt: skip
        response = out[:, ids.shape[1] :]
        is_stop = torch.isin(response, torch.tensor(self.stop_token_ids, device=response.device)).long()
        return response, recorder.result(response).masked_fill(is_stop.cumsum(1) - is_stop > 0, 0.0)


def load(config: ModelConfig) -> CausalLMPolicy:
    """A Qwen3 (or other transformers causal LM) checkpoint folder with its tokenizer."""
    if not config.path or not Path(config.path).is_dir():
        raise FileNotFoundError(f"model.path={config.path!r}: give the local folder of a Qwen3 checkpoint")
    net = AutoModelForCausalLM.from_pretrained(config.path, dtype=getattr(torch, config.dtype))
    return CausalLMPolicy(net, AutoTokenizer.from_pretrained(config.path))
