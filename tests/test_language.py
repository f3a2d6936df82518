"""Language models on tiny random twins: adapters, rollout, objectives, data preparation, every recipe, resume."""

import json
import math
import wave
import weakref

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextExperts

from omnialign.algorithms.policy_gradient import ppo_clip
from omnialign.cli import main as cli
from omnialign.config import GenerationConfig, ModelConfig, apply_overrides, validate
from omnialign.data.language import cap_by_modality, load_records, pair_batches
from omnialign.engine import checkpoint
from omnialign.export import write_adapter
from omnialign.metrics import read_metrics, without_timing
from omnialign.models import lora, qwen3, qwen3_omni, tiny
from omnialign.recipes import RECIPES
from omnialign.rollout import decode
from omnialign.rollout.language import generate, left_pad, response_lengths
from omnialign.train import main
from omnialign.trainer.language_objectives import pair_scores


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    return {"qwen3": tiny.qwen3(root / "qwen3"), "qwen3_omni": tiny.qwen3_omni(root / "omni")}


def write_media(root, n=4):
    """n images (PNG) and n one-second tones (16-bit WAV) under root."""
    for i in range(n):
        Image.fromarray((np.random.default_rng(i).random((40, 48, 3)) * 255).astype(np.uint8)).save(root / f"{i}.png")
        tone = (np.sin(np.arange(16000) * 2 * math.pi * (200 + 50 * i) / 16000) * 8000).astype(np.int16)
        with wave.open(str(root / f"{i}.wav"), "wb") as f:
            f.setnchannels(1), f.setsampwidth(2), f.setframerate(16000), f.writeframes(tone.tobytes())


@pytest.fixture(scope="module")
def omni_data(tmp_path_factory):
    """AVQA-style questions and omni preference pairs over images and audio, prepared by the CLI."""
    root = tmp_path_factory.mktemp("omni_data")
    write_media(root)
    avqa = [{"id": f"q{i}", ("image" if i % 2 else "audio"): f"{i % 4}.{'png' if i % 2 else 'wav'}",
             "question": "What is it?", "options": ["a dog", "a car"], "answer": i % 2,
             "split": "val" if i >= 8 else "train"} for i in range(12)]  # fmt: skip
    pairs = [{"id": f"p{i}", ("image" if i % 2 else "audio"): f"{i % 4}.{'png' if i % 2 else 'wav'}",
              "prompt": "Describe it.", "chosen": "a dog", "rejected": "a car",
              "split": "val" if i >= 8 else "train"} for i in range(12)]  # fmt: skip
    (root / "avqa.json").write_text(json.dumps(avqa))
    (root / "pairs.jsonl").write_text("\n".join(json.dumps(p) for p in pairs))
    cli(["prepare", "avqa", str(root / "avqa.json"), str(root / "avqa.parquet")])
    cli(["prepare", "omni-preference", str(root / "pairs.jsonl"), str(root / "pairs.parquet")])
    return root


def test_head_logprobs_equal_log_softmax_in_chunks():
    hidden, weight = torch.randn(2, 5, 8, requires_grad=True), torch.randn(11, 8)
    targets = torch.randint(0, 11, (2, 5))
    out = qwen3.head_logprobs(hidden, weight, targets, temperature=0.7, chunk=2)
    expected = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, expected)
    (grad,) = torch.autograd.grad(out.sum(), hidden)
    torch.testing.assert_close(grad, torch.autograd.grad(expected.sum(), hidden)[0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bf16_head_equals_the_float32_head(device):
    """`qwen3.head_logits` on a bf16 hidden state and head (on a GPU tensor-core GEMMs accumulating in float32, the
    backward's float32 gradient split in two bf16 parts): the logits are the float32 GEMM of the upcast operands up
    to the order of summation (a GEMM that rounded its sums or output to bf16 would be off by about 1e-2 here), and
    at least 99% of the elements of both gradients are that GEMM's gradients rounded to bf16 (a backward through
    the gradient rounded to bf16 alone differs on 43% of them)."""
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(2, 64, 512, generator=g) * 8).bfloat16().to(device).requires_grad_()
    weight = (torch.randn(1000, 512, generator=g) * 0.02).bfloat16().to(device).requires_grad_()
    upstream = torch.randn(2, 64, 1000, generator=g).to(device)
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    logits, reference = qwen3.head_logits(hidden, weight), h32 @ w32.T
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference, atol=5e-4, rtol=1e-6)
    (logits * upstream).sum().backward()
    (reference * upstream).sum().backward()
    for grad, expected in ((hidden.grad, h32.grad), (weight.grad, w32.grad)):
        assert grad.dtype == torch.bfloat16
        assert (grad == expected.bfloat16()).float().mean() >= 0.99, (grad - expected).abs().max()


def assert_recorded_log_probs_match_the_forward(policy, batch):
    """The log-probs recorded while generating `batch` equal a training forward's over prompt and response."""
    ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    mask = torch.cat([batch.prompt_mask, batch.response_mask.long()], 1)
    with torch.no_grad():
        logp = policy.token_logprobs(ids, mask, batch.media, batch.prompt_ids.shape[1])
    torch.testing.assert_close(logp * batch.response_mask, batch.log_probs * batch.response_mask, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_omni"])
def test_rollout_log_probs_equal_the_training_forward(models, arch, tmp_path):
    """Porting check: the sampling log-probs recorded during generation equal a full forward's, with media."""
    policy = {"qwen3": qwen3, "qwen3_omni": qwen3_omni}[arch].load(ModelConfig(arch=arch, path=str(models[arch])))
    prompts = [[{"role": "user", "content": "Hello"}]]
    if arch == "qwen3_omni":
        write_media(tmp_path, 1)
        frames = (np.random.default_rng(0).random((3, 32, 32, 3)) * 255).astype(np.uint8)
        prompts += [[{"role": "user", "content": [{"type": "image", "image": str(tmp_path / "0.png")},
                                                  {"type": "audio", "audio": str(tmp_path / "0.wav")},
                                                  {"type": "text", "text": "What?"}]}],
                    [{"role": "user", "content": [{"type": "video", "video": frames},
                                                  {"type": "text", "text": "?"}]}]]  # fmt: skip
    config = GenerationConfig(max_new_tokens=6, micro_batch_size=8)
    batch, texts = generate(policy, prompts, 2, torch.arange(len(prompts)), config, torch.device("cpu"), seed=3)
    assert len(texts) == 2 * len(prompts) and batch.batch_size[0] == 2 * len(prompts)
    assert_recorded_log_probs_match_the_forward(policy, batch)
    again, _ = generate(policy, prompts, 2, torch.arange(len(prompts)), config, torch.device("cpu"), seed=3)
    assert torch.equal(again.response_ids, batch.response_ids)  # seeded per step


@pytest.mark.parametrize("device, decoder", [("cpu", "static"), pytest.param("cuda", "static", marks=pytest.mark.gpu),
                                             pytest.param("cuda", "compiled", marks=pytest.mark.gpu)])  # fmt: skip
def test_tiny_thinker_static_decoder_continues_media_prompts_as_transformers_generate(models, tmp_path, device,
                                                                                       decoder):  # fmt: skip
    """The static decoder on the thinker (its prompts through the thinker's own forward: towers, deepstack, M-RoPE;
    then its own decode steps, on CUDA a graph replay, through the routed experts at positions past the prompt's
    largest) greedily picks transformers' tokens with its log-probs, in one left-padded batch of text, image + audio
    and video prompts; on CUDA also with the decode step compiled."""
    policy = qwen3_omni.load(ModelConfig(arch="qwen3_omni", path=str(models["qwen3_omni"])))
    policy.transformer.to(device)
    write_media(tmp_path, 1)
    frames = (np.random.default_rng(0).random((3, 32, 32, 3)) * 255).astype(np.uint8)
    prompts = [[{"role": "user", "content": "Hello"}],
               [{"role": "user", "content": [{"type": "image", "image": str(tmp_path / "0.png")},
                                             {"type": "audio", "audio": str(tmp_path / "0.wav")},
                                             {"type": "text", "text": "What?"}]}],
               [{"role": "user", "content": [{"type": "video", "video": frames},
                                             {"type": "text", "text": "?"}]}]]  # fmt: skip
    out = {}
    for name in (decoder, "transformers"):
        config = GenerationConfig(max_new_tokens=8, micro_batch_size=3, decoder=name)
        out[name], _ = generate(policy, prompts, 1, torch.arange(3), config, torch.device(device), 0, greedy=True)
    assert torch.equal(out[decoder].response_ids, out["transformers"].response_ids)
    torch.testing.assert_close(out[decoder].log_probs, out["transformers"].log_probs, atol=1e-5, rtol=0)


def test_static_decoder_frees_the_thinkers_prefill_cache_once_copied(models):
    """The prompts' keys and values from the thinker's own forward live on only in the decoder's static cache: the
    prefill's copies are freed once copied (on a 30B thinker with media prompts they are gigabytes)."""
    policy = qwen3_omni.load(ModelConfig(arch="qwen3_omni", path=str(models["qwen3_omni"])))
    ids, mask = left_pad(policy.encode([[{"role": "user", "content": "Hi there"}]])[0] * 2, policy.pad_token_id)
    with policy.generating():
        prefill = policy.prefill(ids, mask, None)
        cached = [weakref.ref(t) for t in prefill.keys + prefill.values]
        assert len(cached) == 2 * len(policy.language_model.layers) and all(r() is not None for r in cached)
        decode.generate(policy.transformer, ids, mask, policy.stop_token_ids, policy.pad_token_id, 3, prefill=prefill)
    assert all(r() is None for r in cached)


def test_omni_responses_hold_no_media_tokens_even_where_the_head_prefers_them(models, tmp_path):
    """A thinker whose head puts nearly all mass on the media starts samples none of them, and the training
    forward over an image prompt and that response gives the recorded log-probs (a sampled audio start made
    transformers' M-RoPE look for an audio input that was not there: GSPO with image rows crashed)."""
    policy = qwen3_omni.load(ModelConfig(arch="qwen3_omni", path=str(models["qwen3_omni"])))
    config = policy.transformer.config
    starts = [config.vision_start_token_id, config.audio_start_token_id]
    head = policy.transformer.get_output_embeddings().weight
    direction = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        head.zero_()
        head[starts[0]], head[starts[1]] = 100 * direction, -100 * direction  # one of the two wins every step
    write_media(tmp_path, 1)
    prompts = [[{"role": "user", "content": [{"type": "image", "image": str(tmp_path / "0.png")},
                                              {"type": "text", "text": "What?"}]}]]  # fmt: skip
    batch, _ = generate(policy, prompts, 2, torch.arange(1), GenerationConfig(max_new_tokens=6, micro_batch_size=2),
                        torch.device("cpu"), seed=0)  # fmt: skip
    assert not torch.isin(batch.response_ids, torch.tensor(policy.banned_token_ids)).any()
    assert_recorded_log_probs_match_the_forward(policy, batch)


def test_omni_generation_reads_every_expert_once_and_agrees_with_transformers(models, monkeypatch):
    """The thinker's experts in generation (every expert on every token of a decode step, mixed by the routing
    weights) give transformers' eager experts' output; above the token limit (a prefill) they are `grouped_mm`'s,
    bit for bit; generation uses them, so `generate` keeps them instead of switching to `batched_mm`, and gives
    every other forward its own experts back."""
    policy = qwen3_omni.load(ModelConfig(arch="qwen3_omni", path=str(models["qwen3_omni"])))
    own = policy.transformer.get_experts_implementation()
    experts = next(m for m in policy.language_model.modules() if isinstance(m, Qwen3OmniMoeThinkerTextExperts))
    seen = []
    hook = experts.register_forward_pre_hook(lambda module, args: seen.append(module.config._experts_implementation))
    ids = torch.tensor([policy.tokenizer("Hi there").input_ids] * 2)
    policy.generate(ids, torch.ones_like(ids), None, {"max_new_tokens": 3, "do_sample": False})
    hook.remove()
    assert seen == ["dense_decode"] * 3 and policy.transformer.get_experts_implementation() == own
    assert "dense_decode" not in own.values()

    torch.manual_seed(0)
    with torch.no_grad():
        experts.gate_up_proj.normal_(), experts.down_proj.normal_()  # outputs far above rounding
    k, tokens = experts.config.num_experts_per_tok, 7
    hidden = torch.randn(tokens, experts.hidden_dim)
    picks = torch.stack([torch.randperm(experts.num_experts)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k)
    out = {}
    for impl in ("eager", "grouped_mm", "dense_decode"):
        experts.config._experts_implementation = impl
        out[impl] = experts(hidden, picks, weights)
    torch.testing.assert_close(
        out["dense_decode"], out["eager"], rtol=1e-5, atol=1e-5 * out["eager"].abs().max().item()
    )
    assert not torch.equal(out["dense_decode"], out["grouped_mm"])  # its own sums ran, not grouped_mm's
    monkeypatch.setattr(qwen3_omni, "DENSE_EXPERTS_MAX_TOKENS", tokens - 1)
    assert torch.equal(experts(hidden, picks, weights), out["grouped_mm"])


def test_response_ends_at_the_first_stop_token_or_string(models):
    policy = qwen3.load(ModelConfig(arch="qwen3", path=str(models["qwen3"])))
    tok = policy.tokenizer
    rows = [tok("ab</answer>cd").input_ids, tok("xy").input_ids + [tok.eos_token_id] + tok("zz").input_ids]
    width = max(map(len, rows))
    response = torch.tensor([r + [policy.pad_token_id] * (width - len(r)) for r in rows])
    assert response_lengths(policy, response, ["</answer>"]).tolist() == [len("ab</answer>"), 3]
    assert response_lengths(policy, response, []).tolist() == [width, 3]


def test_omni_lora_targets_only_language_attention_and_export_lines_up(models, tmp_path):
    from peft import PeftModel

    policy = qwen3_omni.load(ModelConfig(arch="qwen3_omni", path=str(models["qwen3_omni"])))
    net = policy.transformer
    config = lora.apply_lora(net, 4, 8, policy.lora_targets)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in net.named_parameters() if ".lora_A." in n}
    language = {n for n, m in net.named_modules() if m is policy.language_model}.pop()
    assert adapted and all(n.startswith(language + ".layers.") and ".self_attn." in n for n in adapted)
    assert len(adapted) == 4 * len(policy.language_model.layers)
    with torch.no_grad():
        for layer in lora.lora_layers(net):
            layer.lora_B["default"].weight.normal_()
    write_adapter(net, config, tmp_path / "adapter")
    fresh = qwen3_omni.load(ModelConfig(arch="qwen3_omni", path=str(models["qwen3_omni"]))).transformer
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    ids = torch.randint(0, 256, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, net(input_ids=ids).logits)
    with pytest.raises(ValueError, match="MoE experts"):
        qwen3_omni.check_lora_targets(["q_proj", "down_proj"])


def test_distillation_term_hand_values():
    """OPD: reward -(logp_old - logp_teacher) per token, importance-sampled: at rho = 1 the loss is old - teacher."""
    old, teacher = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    logp = old.clone().requires_grad_(True)
    loss, _ = ppo_clip(logp, old, -(old - teacher), 0.2, 0.28, adv_clip=None)
    torch.testing.assert_close(loss, torch.tensor([0.5, -1.0]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.5, -1.0]))  # lowers logp where the teacher disagrees


def test_pair_scores_sum_or_average():
    logp, mask = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]]), torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(pair_scores(logp, mask, average=False), torch.tensor([-3.0, -3.0]))
    torch.testing.assert_close(pair_scores(logp, mask, average=True), torch.tensor([-1.5, -3.0]))


def test_validation_cap_is_split_evenly_and_batches_hold_one_modality():
    records = [{"modality": "image", "i": i} for i in range(10)] + [{"modality": "audio", "i": i} for i in range(2)]
    capped = cap_by_modality(records, 6)
    assert [r["modality"] for r in capped].count("audio") == 2 and len(capped) == 6  # the unused share goes on
    assert [r["modality"] for r in cap_by_modality(records, 4)].count("audio") == 2
    for step in range(1, 12):
        index = pair_batches(records, 3, seed=0, step=step)
        assert len(index) == 3 and len({records[i]["modality"] for i in index}) == 1
    assert pair_batches(records, 3, 0, 5) == pair_batches(records, 3, 0, 5)


def test_prepare_reports_missing_media_up_front(tmp_path, omni_data):
    items = [{"id": "a", "image": "0.png", "question": "Q", "options": ["x", "y"], "answer": "B"},
             {"id": "b", "image": "nope.png", "question": "Q", "options": ["x", "y"], "answer": 0}]  # fmt: skip
    (omni_data / "bad.json").write_text(json.dumps(items))
    with pytest.raises(SystemExit, match="nope.png"):
        cli(["prepare", "avqa", str(omni_data / "bad.json"), str(tmp_path / "bad.parquet")])
    assert not (tmp_path / "bad.parquet").exists()
    cli(["prepare", "avqa", str(omni_data / "bad.json"), str(tmp_path / "ok.parquet"), "--skip-missing",
         "--val-fraction", "0"])  # fmt: skip
    (record,) = load_records(str(tmp_path / "ok.parquet"), "train")
    assert record["ground_truth"] == "B" and record["modality"] == "image"
    assert record["prompt"][0]["content"][0]["image"] == str((omni_data / "0.png").resolve())
    val = load_records(str(omni_data / "pairs.parquet"), "val")
    assert {r["modality"] for r in val} == {"image", "audio"} and val[0]["chosen"] == "a dog"


TINY = ["trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
        "data.prompts_per_step=2", "rollout.n=2", "data.val_limit=4", "actor.micro_batch_size=4",
        "actor.mini_batch_size=null", "generation.max_new_tokens=4"]  # fmt: skip


def recipe_config(name, models, omni_data, tmp_path, *extra):
    overrides = [f"trainer.output_dir={tmp_path}", *TINY]
    if name.startswith("choice"):
        overrides += [f"model.path={models['qwen3']}"]
        if name == "choice_distill":
            overrides += [f"algorithm.teacher_path={models['qwen3']}"]
    else:
        data = omni_data / ("pairs.parquet" if name.endswith("dpo") else "avqa.parquet")
        overrides += [f"model.path={models['qwen3_omni']}", "model.dtype=float32", f"data.prompts={data}",
                      f"data.val_prompts={data}", "model.lora.rank=4", "model.lora.alpha=8"]  # fmt: skip
        # the recipes' compiled decoder costs a C++ build per run on a CPU; its own test below runs it
        overrides += ["generation.decoder=static"]
    return validate(apply_overrides(RECIPES[name](), [*overrides, *extra]))


LANGUAGE_RECIPES = [n for n in RECIPES if n.startswith(("choice", "qwen3_omni"))]


@pytest.mark.parametrize("name", LANGUAGE_RECIPES)
def test_every_language_recipe_runs_two_steps(name, models, omni_data, tmp_path):
    """Each language recipe, 2 steps; the choice recipes with trainer.deterministic twice, giving the same
    metrics.jsonl bit for bit (timings aside)."""
    deterministic = ["trainer.deterministic=true"] if name.startswith("choice") else []
    summary = main(recipe_config(name, models, omni_data, tmp_path, *deterministic))
    run = tmp_path / name
    records = read_metrics(run / "metrics.jsonl")
    if deterministic:
        main(recipe_config(name, models, omni_data, tmp_path / "again", *deterministic))
        again = read_metrics(tmp_path / "again" / name / "metrics.jsonl")
        assert without_timing(records) == without_timing(again)
    assert [r["step"] for r in records] == [0, 1, 2] and summary["steps"] == 2
    assert all(math.isfinite(r["actor/loss"]) for r in records[1:])
    assert checkpoint.latest(run).name == "step_000002"
    if name.endswith("dpo"):
        assert "val/dpo/margin" in records[-1] and "timing/reference" in records[1]
    else:
        assert (run / "samples" / "step_000002.jsonl").exists() and "reward/mean" in records[1]


@pytest.mark.parametrize("name", ["choice_gspo", "qwen3_omni_gspo"])
def test_compiled_decoder_trains_as_the_static_one(name, models, omni_data, tmp_path):
    """`generation.decoder=compiled` (the decode step through torch.compile, inside the trainer's FSDP2-wrapped
    network, unsharded for the generation) samples the static decoder's responses and trains to the same metrics
    (float32: within the compiled kernels' rounding), and it did compile (dynamo's graph count); on a dense model and
    on the omni thinker (routed experts, media prompts)."""
    from torch._dynamo.utils import counters

    runs = {}
    for decoder in ("static", "compiled"):
        counters.clear()
        main(recipe_config(name, models, omni_data, tmp_path / decoder, f"generation.decoder={decoder}"))
        run = tmp_path / decoder / name
        runs[decoder] = without_timing(read_metrics(run / "metrics.jsonl")), (run / "samples" / "step_000002.jsonl")
    assert counters["stats"]["unique_graphs"] > 0  # the compiled run's decode step
    (a, samples_a), (b, samples_b) = runs["static"], runs["compiled"]
    assert samples_a.read_text() == samples_b.read_text()
    assert [r["step"] for r in b] == [0, 1, 2] and a[0].keys() == b[0].keys()
    for ra, rb in zip(a, b):
        for key in ra:
            assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-5), (ra["step"], key)


@pytest.mark.parametrize("name, ema", [("choice_dapo", 0), ("choice_distill", 0), ("choice_dpo", 0),
                                       ("choice_dapo", 0.5), ("choice_dpo", 0.5)])  # fmt: skip
def test_language_run_resumes_identically(name, ema, models, omni_data, tmp_path):
    """RL, on-policy distillation (a frozen teacher) and offline DPO (a reference): 3 steps = 2 + a resumed one;
    RL and DPO also with validation on the moving average of the trained parameters (`trainer.ema_decay`)."""
    args = ["trainer.total_steps=3", "trainer.save_every=2", "trainer.val_every=2", f"trainer.ema_decay={ema}"]
    main(recipe_config(name, models, omni_data, tmp_path / "a", *args))
    main(recipe_config(name, models, omni_data, tmp_path / "b", *args, "trainer.total_steps=2"))
    main(recipe_config(name, models, omni_data, tmp_path / "b", *args), resume="auto")

    a = without_timing(read_metrics(tmp_path / "a" / name / "metrics.jsonl"))
    b = without_timing(read_metrics(tmp_path / "b" / name / "metrics.jsonl"))
    assert [r["step"] for r in b] == [0, 1, 2, 3] and a == b


def test_prepare_choice_writes_base_teacher_and_student(tmp_path):
    from omnialign.worlds.choice.pretrain import ChoicePretrainConfig, prepare_choice

    with pytest.raises(ValueError, match="clean_steps=6"):
        prepare_choice(ChoicePretrainConfig(out=str(tmp_path), steps=6, clean_steps=6))
    report = prepare_choice(ChoicePretrainConfig(out=str(tmp_path), steps=6, clean_steps=3))
    for folder in (tmp_path, tmp_path / "teacher", tmp_path / "student"):
        assert (folder / "config.json").exists() and (folder / "tokenizer_config.json").exists()
    assert json.loads((tmp_path / "pretrain.json").read_text()) == report
    assert set(report["base"]) == {"accuracy", "accuracy_smallest", "accuracy_largest", "answers_A"}


@pytest.mark.gpu
def test_tiny_thinker_dpo_trains_twenty_steps_on_image_audio_and_video_rows(models, omni_data, tmp_path):
    """qwen3_omni_dpo on CUDA, each batch one modality: pairs over images, audio and video (frames in .npy)."""
    for i in range(4):
        np.save(omni_data / f"clip{i}.npy", (np.random.default_rng(i).random((4, 32, 32, 3)) * 255).astype(np.uint8))
    kinds = [("image", "png"), ("audio", "wav"), ("video", "npy")]
    pairs = [{"id": f"m{i}", kinds[i % 3][0]: f"{'clip' if i % 3 == 2 else ''}{i % 4}.{kinds[i % 3][1]}",
              "prompt": "Describe it.", "chosen": "a dog", "rejected": "a car",
              "split": "val" if i >= 18 else "train"} for i in range(24)]  # fmt: skip
    (omni_data / "mixed.jsonl").write_text("\n".join(json.dumps(p) for p in pairs))
    cli(["prepare", "omni-preference", str(omni_data / "mixed.jsonl"), str(tmp_path / "mixed.parquet")])
    data = tmp_path / "mixed.parquet"
    assert {r["modality"] for r in load_records(str(data), "train")} == {"image", "audio", "video"}
    steps = ["trainer.total_steps=20", "trainer.val_every=10", "trainer.save_every=20", "data.val_limit=6"]
    summary = main(recipe_config("qwen3_omni_dpo", models, omni_data, tmp_path, f"data.prompts={data}",
                                 f"data.val_prompts={data}", *steps))  # fmt: skip
    records = read_metrics(tmp_path / "qwen3_omni_dpo" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(21)) and summary["steps"] == 20
    assert all(math.isfinite(r["actor/loss"]) and r["actor/skipped_updates"] == 0 for r in records[1:])
    assert math.isfinite(summary["val/dpo/margin_after"])  # a tiny random model: no learning is claimed
