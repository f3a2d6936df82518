"""`omnialign judge`: the tiny thinker and the glyphs generator against a local OpenAI-compatible judge over HTTP."""

import base64
import json
import math
import re
import shutil
import threading
import wave
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from http_stub import JSONHandler, serving
from peft import PeftModel
from PIL import Image
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from omnialign import judge
from omnialign.cli import main as cli
from omnialign.config import Config, to_dict
from omnialign.data.omni import prepare
from omnialign.export import write_adapter
from omnialign.models import lora, qwen3_omni, tiny
from omnialign.rewards.base import from_png
from omnialign.worlds.glyphs import model as glyphs
from omnialign.worlds.glyphs.data import ASSETS


class JudgeServer(ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint whose replies come from `decide(text, body)`: a reply string, or an
    HTTP error code. Chat request bodies are kept in `seen`."""

    daemon_threads = True

    def __init__(self, decide):
        super().__init__(("127.0.0.1", 0), Handler)
        self.decide, self.seen, self.lock = decide, [], threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(JSONHandler):
    server: JudgeServer

    def do_GET(self):
        self.answer(200 if self.path == "/v1/models" else 404, {"object": "list", "data": [{"id": "test-judge"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.seen.append(body)
        text = "\n".join(c["text"] for c in body["messages"][0]["content"] if c["type"] == "text")
        reply = self.server.decide(text, body)
        if isinstance(reply, int):
            return self.answer(reply, {"error": {"message": "judge refuses"}})
        self.answer(200, {"object": "chat.completion", "model": body["model"],
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})  # fmt: skip


@contextmanager
def judge_server(decide):
    with serving(JudgeServer(decide)) as server:
        yield server


def answers_in(text: str) -> tuple[str, str]:
    return tuple(re.search(rf"\[Answer {s}\]\n(.*)\n\[End of Answer {s}\]", text, re.S).group(1) for s in "AB")


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def perturbed(net: torch.nn.Module, targets: list[str], seed: int = 0):
    """A rank-4 LoRA on `net` with random B (so the adapter changes the outputs)."""
    config = lora.apply_lora(net, 4, 8, targets)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora.lora_layers(net):
            w = layer.lora_B["default"].weight
            w.copy_(torch.randn(w.shape, generator=g) * 0.5)
    return config


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny thinker, AVQA-style questions over images, audio and video, and a trained adapter of it saved both
    as a PEFT folder and as an omnialign training checkpoint (run folder with config.json)."""
    root = tmp_path_factory.mktemp("judge")
    base = tiny.qwen3_omni(root / "omni")
    rng = np.random.default_rng(0)
    items = []
    for i in range(9):
        kind = ("image", "audio", "video")[i % 3]
        if kind == "image":
            Image.fromarray((rng.random((40, 48, 3)) * 255).astype(np.uint8)).save(root / f"{i}.png")
        elif kind == "audio":
            tone = (np.sin(np.arange(16000) * 2 * math.pi * (200 + 50 * i) / 16000) * 8000).astype(np.int16)
            with wave.open(str(root / f"{i}.wav"), "wb") as f:
                f.setnchannels(1), f.setsampwidth(2), f.setframerate(16000), f.writeframes(tone.tobytes())
        else:
            np.save(root / f"{i}.npy", (rng.random((3, 32, 32, 3)) * 255).astype(np.uint8))
        media = {kind: f"{i}.{dict(image='png', audio='wav', video='npy')[kind]}"}
        items.append({"id": f"q{i}", **media, "question": f"Question {i}: what is it?", "options": ["a dog", "a car"],
                      "answer": i % 2, "split": "val"})  # fmt: skip
    items.append({"id": "t0", "image": "0.png", "question": "Question 99: train only", "options": ["x", "y"],
                  "answer": 0, "split": "train"})  # fmt: skip
    (root / "avqa.json").write_text(json.dumps(items))
    (root / "data").mkdir()
    prepare("avqa", root / "avqa.json", root / "data" / "avqa.parquet")

    policy = qwen3_omni.load(qwen3_omni.ModelConfig(arch="qwen3_omni", path=str(base)))
    lora_config = perturbed(policy.transformer, policy.lora_targets)
    write_adapter(policy.transformer, lora_config, root / "peft")
    config = Config(name="run", recipe="qwen3_omni_grpo")
    config.model.arch, config.model.path, config.model.lora.rank, config.model.lora.alpha = (
        "qwen3_omni",
        str(base),
        4,
        8,
    )
    config.generation.max_new_tokens, config.generation.micro_batch_size = 6, 4
    (root / "run" / "checkpoints").mkdir(parents=True)
    (root / "run" / "config.json").write_text(json.dumps(to_dict(config)))
    state = {"model": get_model_state_dict(policy.transformer, options=StateDictOptions(ignore_frozen_params=True))}
    dcp.save(state, checkpoint_id=root / "run" / "checkpoints" / "step_000002", no_dist=True)
    return root, base


def run(*args, **options):
    argv = ["judge", *args]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", *(value if isinstance(value, list) else [str(value)])]
    cli(argv)


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ("Answer A is more accurate.\n\n[[A]]", "A"),
        ("After comparing both, Answer B is better.", "B"),
        ("**Final verdict:** [[C]]", "tie"),
        ('{"verdict": "B", "reason": "grounded in the audio"}', "B"),
        ('```json\n{"winner": "Answer A"}\n```', "A"),
        ("It's a tie: both are equally good.", "tie"),
        ("tie", "tie"),
        ("B.", "B"),
        ("The better response is A, since it names the dog.", "A"),
        ("I prefer B.", "B"),
        ("I cannot decide between them.", None),
        ("[[A]] ... on reflection, [[B]]", None),
        ("The correct option is B, and the man wears a tie.", None),  # neither names a verdict
        ("", None),
    ],
)
def test_verdict_parser(reply, verdict):
    assert judge.parse_verdict(reply) == verdict


def test_three_stages_resume_and_position_bias(world, tmp_path, monkeypatch):
    root, base = world
    out = tmp_path / "results.jsonl"
    common = dict(data=root / "data", base=base, out=out)
    tokens = ["generation.max_new_tokens=6", "generation.micro_batch_size=2"]
    files = judge.stage_files(out)

    # reference: interrupted after one chunk of 2, then resumed; a cut-off last line is redone
    real, calls = judge.generate, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(judge, "generate", failing)
    with pytest.raises(RuntimeError, match="killed"):
        run(*tokens, **common, stage="reference")
    assert len(lines(files["reference"])) == 2
    monkeypatch.setattr(judge, "generate", real)
    run(*tokens, **common, stage="reference")
    text = files["reference"].read_text()
    files["reference"].write_text(text[: text.rindex("\n", 0, len(text) - 1) + 20])  # the last line cut short
    run(*tokens, **common, stage="reference")
    reference = lines(files["reference"])
    assert len(reference) == 9 and len({judge.key(r) for r in reference}) == 9
    assert [r["index"] for r in reference] == list(range(9)) and reference[-1]["file"] == "avqa.parquet"
    assert files["reference"].read_text() == text

    # the judge before the trained answers, and other settings on a cached stage: clear errors
    with pytest.raises(SystemExit, match="no trained answer .* run --stage trained first"):
        run(*tokens, **common, stage="judge", judge_url="http://127.0.0.1:9")
    with pytest.raises(SystemExit, match="max_new_tokens.*'cached': 6, 'now': 7"):
        run("generation.max_new_tokens=7", **common, stage="reference")

    run(*tokens, **common, stage="trained", adapter=root / "peft")
    trained = {judge.key(r): r["answer"] for r in lines(files["trained"])}
    differ = sum(trained[judge.key(r)] != r["answer"] for r in reference)
    assert differ >= 5  # the adapter changes most answers

    by_question = {r["index"]: r["answer"] for r in lines(files["trained"])}

    def prefers_trained(text, body, fail_at=None):
        """Picks the trained answer (which it knows), in free words; a tie when both are the same."""
        if fail_at is not None and len(server.seen) == fail_at:
            return 400
        a, b = answers_in(text)
        side = "A" if a == by_question[int(re.search(r"Question (\d+)", text).group(1))] else "B"
        return "Both are equally good. [[C]]" if a == b else f"Answer {side} is better.\n[[{side}]]"

    with judge_server(lambda t, b: prefers_trained(t, b, fail_at=4)) as server:
        with pytest.raises(SystemExit, match="HTTP 400: .*judge refuses"):
            run(*tokens, **common, stage="judge", judge_url=server.url, concurrency=1)
        assert len(lines(files["judge"])) == 3
    with judge_server(prefers_trained) as server:
        run(*tokens, **common, stage="all", judge_url=server.url, adapter=root / "peft")  # only the judge has work
        assert len(server.seen) == 6 and server.seen[0]["model"] == "test-judge"
        bodies = server.seen
    verdicts = lines(files["judge"])
    assert [judge.key(v) for v in verdicts] == [judge.key(r) for r in reference]
    summary = json.loads(files["summary"].read_text())
    overall = summary["overall"]
    assert overall == {**overall, "n": 9, "win": differ, "tie": 9 - differ, "loss": 0, "malformed": 0}
    assert 0 < overall["trained_shown_first"] < 9  # both orders occur
    assert set(summary["by_modality"]) == {"image", "audio", "video"} and summary["by_modality"]["video"]["n"] == 3
    for v in verdicts:
        assert v["answers"] == {"trained": trained[judge.key(v)], "reference": reference[v["index"]]["answer"]}

    # what the judge saw: the question, the media, the answers in the recorded order
    asked = {int(re.search(r"Question (\d+)", str(b)).group(1)): b["messages"][0]["content"] for b in bodies}
    assert sorted(asked) == list(range(3, 9))  # the items not judged before the failure, each once
    for v in verdicts[3:]:
        content = asked[v["index"]]
        text = "\n".join(c["text"] for c in content if c["type"] == "text")
        assert answers_in(text) == (v["answers"][v["A"]], v["answers"][v["B"]])
        kinds = [c["type"] for c in content]
        if v["modality"] == "image":
            image = next(c["image_url"]["url"] for c in content if c["type"] == "image_url")
            assert image.startswith("data:image/png;base64,")
            assert from_png(base64.b64decode(image.split(",", 1)[1])).shape == (3, 40, 48)
        elif v["modality"] == "audio":
            audio = next(c["input_audio"] for c in content if c["type"] == "input_audio")
            assert audio["format"] == "wav" and base64.b64decode(audio["data"])[:4] == b"RIFF"
        else:
            assert kinds.count("image_url") == 3 and "[video: 3 of its 3 frames, in order]" in text

    # position bias: a judge that always picks the first answer; every verdict undone into the trained side
    shutil.copy(files["reference"], tmp_path / "bias.reference.jsonl")
    shutil.copy(files["trained"], tmp_path / "bias.trained.jsonl")
    shutil.copy(files["settings"], tmp_path / "bias.settings.json")
    with judge_server(lambda t, b: "[[A]]") as server:
        run(**common | {"out": tmp_path / "bias.jsonl"}, stage="judge", judge_url=server.url + "/v1")
    bias = lines(tmp_path / "bias.jsonl")
    assert [v["A"] for v in bias] == [v["A"] for v in verdicts]  # the order is seeded per item
    assert all(v["outcome"] == ("win" if v["A"] == "trained" else "loss") for v in bias)
    c = json.loads((tmp_path / "bias.summary.json").read_text())["overall"]
    assert (c["win"], c["loss"], c["judge_picked_first"]) == (overall["trained_shown_first"], 9 - c["win"], 9)

    # free-form and malformed replies, chosen by the question number
    replies = ["[[A]]", "Answer B is better.", '{"verdict": "tie"}', "I cannot decide.", "[[A]] no, [[B]]", "B",
               "It's a tie.", "Hmm.", '{"winner": "A"}']  # fmt: skip
    parsed = ["A", "B", "tie", "malformed", "malformed", "B", "tie", "malformed", "A"]
    for f in ("reference", "trained", "settings"):
        shutil.copy(files[f], judge.stage_files(tmp_path / "free.jsonl")[f])
    with judge_server(lambda t, b: replies[int(re.search(r"Question (\d+)", t).group(1))]) as server:
        run(**common | {"out": tmp_path / "free.jsonl"}, stage="judge", judge_url=server.url, seed=0)
    free = lines(tmp_path / "free.jsonl")
    assert [v["verdict"] for v in free] == parsed
    expected = [{"A": v["A"], "B": v["B"], "tie": "tie", "malformed": "malformed"}[p] for v, p in zip(free, parsed)]
    assert [v["outcome"] for v in free] == [{"trained": "win", "reference": "loss"}.get(e, e) for e in expected]
    c = json.loads((tmp_path / "free.summary.json").read_text())["overall"]
    assert c["malformed"] == 3 and c["win"] + c["loss"] + c["tie"] == 6 and c["tie"] == 2


def test_an_endpoint_that_is_down_fails_before_the_answers(world, tmp_path):
    root, base = world
    out = tmp_path / "down.jsonl"
    with pytest.raises(SystemExit, match="is the OpenAI-compatible endpoint up at http://127.0.0.1:9/v1"):
        run(data=root / "data", base=base, out=out, judge_url="http://127.0.0.1:9")
    assert not judge.stage_files(out)["reference"].exists()


def test_adapter_paths(world, tmp_path):
    root, base = world
    step = root / "run" / "checkpoints" / "step_000002"
    assert judge.find_adapter(root / "peft") == ("peft", root / "peft")
    assert judge.find_adapter(root / "run") == ("checkpoint", step)
    assert judge.find_adapter(step) == ("checkpoint", step)
    verl = tmp_path / "verl"
    for n in (1, 3):
        shutil.copytree(root / "peft", verl / f"global_step_{n}" / "actor" / "lora_adapter")
    assert judge.find_adapter(verl) == ("peft", verl / "global_step_3" / "actor" / "lora_adapter")
    assert judge.find_adapter(verl / "global_step_1" / "actor") == ("peft", verl / "global_step_1/actor/lora_adapter")
    (tmp_path / "shards" / "actor").mkdir(parents=True)
    (tmp_path / "shards" / "actor" / "model_world_size_2_rank_0.pt").touch()
    with pytest.raises(FileNotFoundError, match="verl FSDP shards: merge them first"):
        judge.find_adapter(tmp_path / "shards")

    # a checkpoint is exported once (the adapter written from the same weights), and answers as the PEFT folder
    data = dict(data=root / "data", max_samples=4, stage="trained")
    run(**data, adapter=root / "run", out=tmp_path / "ckpt.jsonl")  # the base and settings come from the run
    exported = tmp_path / "ckpt.adapter"
    assert (exported / "exported_from.txt").read_text() == str(step.resolve())
    ours, theirs = load_file(exported / "adapter_model.safetensors"), load_file(root / "peft/adapter_model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    run("generation.max_new_tokens=6", **data, adapter=root / "peft", base=base, out=tmp_path / "peft.jsonl")
    a, b = lines(tmp_path / "ckpt.trained.jsonl"), lines(tmp_path / "peft.trained.jsonl")
    assert len(a) == 4 and [r["answer"] for r in a] == [r["answer"] for r in b]
    assert {r["modality"] for r in a} == {"image", "audio", "video"}  # the cap is split across modalities


def test_glyph_images_judged(tmp_path):
    policy = glyphs.load()
    config = perturbed(policy.transformer, policy.lora_targets, seed=1)
    write_adapter(policy.transformer, config, tmp_path / "glyphs_lora")
    common = dict(data="digits", base=ASSETS, adapter=tmp_path / "glyphs_lora", out=tmp_path / "g.jsonl")
    settings = ["rollout.val_steps=3", "rollout.micro_batch_size=2"]
    rambling = "I compare them. " * 10_000  # 160,000 characters: an endpoint that ignores max_tokens
    with judge_server(lambda t, b: rambling + "Image B shows it better. [[B]]") as server:
        run(*settings, **common, max_samples=4, modalities=["image"], judge_url=server.url)
    files = judge.stage_files(tmp_path / "g.jsonl")
    reference, trained = lines(files["reference"]), lines(files["trained"])
    assert [r["question"] for r in reference] == ["0", "1", "2", "3"]
    for r, t in zip(reference, trained):
        a, b = (np.asarray(Image.open(tmp_path / row["image"])) for row in (r, t))
        assert a.shape == (32, 32) and not np.array_equal(a, b)
    verdicts = lines(files["judge"])
    assert all(v["outcome"] == ("win" if v["B"] == "trained" else "loss") for v in verdicts)
    assert all(v["reply"].endswith(" [... 160030 characters]") for v in verdicts)  # the verdict file keeps 16 KB
    assert all(len(v["reply"]) == judge.REPLY_CHARS + len(" [... 160030 characters]") for v in verdicts)
    asked = {b["messages"][0]["content"][0]["text"].split("[Prompt]\n")[1][0]: b["messages"][0]["content"]
             for b in server.seen}  # fmt: skip
    for v in verdicts:
        content = asked[v["question"]]
        images = [c["image_url"]["url"].split(",", 1)[1] for c in content if c["type"] == "image_url"]
        expected = [(tmp_path / v["answers"][v[s]]).read_bytes() for s in "AB"]
        assert [base64.b64decode(i) for i in images] == expected
        assert f"[Prompt]\n{v['question']}" in content[0]["text"]
    summary = json.loads(files["summary"].read_text())
    assert list(summary["by_modality"]) == ["image"] and summary["overall"]["n"] == 4

    # a full model folder (the merged network, as a full fine-tuning export) draws the same images, up to one
    # 8-bit level: merged and unmerged LoRA round differently (on a GPU, a pixel here and there)
    merged = PeftModel.from_pretrained(glyphs.load().transformer, tmp_path / "glyphs_lora").merge_and_unload()
    merged.save_pretrained(tmp_path / "full")
    assert judge.find_adapter(tmp_path / "full") == ("full", tmp_path / "full")
    run(*settings, **common | {"adapter": tmp_path / "full", "out": tmp_path / "f.jsonl"}, max_samples=4,
        stage="trained")  # fmt: skip
    for a, b in zip(trained, lines(tmp_path / "f.trained.jsonl")):
        pixels = [np.asarray(Image.open(tmp_path / row["image"])).astype(int) for row in (a, b)]
        assert np.abs(pixels[0] - pixels[1]).max() <= 1


def test_video_models_are_refused_with_a_message():
    """judge and eval geneval compare images or texts: a video model is refused at the start, not with 'axes don't
    match array' after drawing."""
    with pytest.raises(ValueError, match="model.arch=glyphs_video draws videos, and judge and eval geneval compare"):
        judge.build_config(str(ASSETS), None, ["model.arch=glyphs_video"], 0)
