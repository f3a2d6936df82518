"""Editing rewards: the VLM judge against a loopback chat server, OCR of the edited text, pixel preservation, and
source images through `omnialign serve-reward` and `RemoteReward`."""

import base64
import json
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest
import torch
from http_stub import JSONHandler, serving
from test_rewards import text_image

from omnialign.config import RewardConfig
from omnialign.rewards import score
from omnialign.rewards.base import from_png, to_png
from omnialign.rewards.client import RemoteReward
from omnialign.rewards.edit import ocr_edit, pixel_preservation, vlm_edit_following
from omnialign.rewards.server import parse_request

FAST = {"backoff": 0.01, "max_backoff": 0.05}


def flat(*values: float, size: tuple[int, int] = (8, 8)) -> torch.Tensor:
    """An image (len(values), H, W) whose channel c is values[c], rounded to 8 bits as PNG keeps it."""
    return torch.tensor(values).mul(255).round().div(255)[:, None, None].expand(-1, *size).clone()


class EditJudge(ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint that judges an edit from what it is sent: the images (source(s)
    first, the result last) and the text. Following: 5 if the result is brighter than the first image by
    more than 0.2, else 1. Preservation: 5 - 4 x the mean absolute difference between the two (rounded), 1
    when their shapes differ. A text asking for neither gets a reply without a score. Requests are kept
    in `seen` as (number of images, text)."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), EditJudgeHandler)
        self.seen, self.lock = [], threading.Lock()


class EditJudgeHandler(JSONHandler):
    server: EditJudge

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = body["messages"][0]["content"]
        images = [from_png(base64.b64decode(c["image_url"]["url"].split(",", 1)[1]))
                  for c in content if c["type"] == "image_url"]  # fmt: skip
        text = content[-1]["text"]
        with self.server.lock:
            self.server.seen.append((len(images), text))
        first, result = images[0], images[-1]
        if text.endswith("Following Score: X"):
            brighter = float(result.mean() - first.mean())
            reply = f"It is brighter by {brighter:.2f}.\n**Following Score (1-5):** {5 if brighter > 0.2 else 1}"
        elif text.endswith("Preservation Score: X"):
            kept = 5 - round(4 * float((result - first).abs().mean())) if result.shape == first.shape else 1
            reply = f"Preservation Score: {kept}/5"
        else:
            reply = "I cannot tell."
        self.answer(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})


def test_vlm_edit_rewards_send_source_and_result_and_the_instruction():
    images = torch.stack([flat(0.8, 0.8, 0.8), flat(0.4, 0.4, 0.4), flat(0.2, 0.2, 0.2)])
    prompts = ["Make the photo brighter", "Make the photo brighter", "Put the second image's sky in the first"]
    metadata = [
        {"sources": [flat(0.2, 0.2, 0.2)]},
        {"sources": [flat(0.4, size=(6, 10))]},  # grayscale and of another size: sent as it is
        {"sources": [flat(0.2, 0.2, 0.2), flat(0.9, 0.1, 0.1, size=(4, 4))]},
    ]
    with serving(EditJudge()) as server:
        options = {"url": f"http://127.0.0.1:{server.server_address[1]}/v1", "model": "judge"}
        names = ("vlm_edit_following", "vlm_edit_preservation")
        config = RewardConfig(weights=dict.fromkeys(names, 1.0), options=dict.fromkeys(names, options))
        scored = score(images, prompts, metadata, config)
        missing = vlm_edit_following(images[:1], prompts[:1], metadata[:1], prompt="Describe: {prompt}", **options)
    assert scored.parts["vlm_edit_following"].tolist() == [1.0, 0.0, 0.0]
    assert scored.parts["vlm_edit_preservation"].tolist() == [0.5, 0.0, 1.0]
    assert scored.info[0]["vlm_edit_following"] == {"following": 1.0, "text": "It is brighter by 0.60.\n"
                                                    "**Following Score (1-5):** 5"}  # fmt: skip
    assert sorted(n for n, _ in server.seen[:6]) == [2, 2, 2, 2, 3, 3]  # each request: the source(s), the result
    for n, text in server.seen[:6]:
        assert ("sky" in text) == (n == 3) and any(f"instruction:\n{p}\n" in text for p in prompts)
    assert missing == [0.0] and missing.info == [{"text": "I cannot tell.", "missing": ["following"]}]
    assert server.seen[-1] == (2, "Describe: Make the photo brighter")
    with pytest.raises(ValueError, match=r'vlm_edit_following.*metadata\[0\]\["sources"\] is None, not a list'):
        vlm_edit_following(images[:1], prompts[:1], [{}], **options)


@pytest.mark.tesseract
def test_ocr_edit_reads_the_result_against_the_target_text():
    images = torch.stack([text_image("OPEN 24"), text_image("CLOSED")])
    metadata = [{"target_text": "open24", "sources": [text_image("CLOSED")]}, {"target_text": "OPEN 24"}]
    scores = ocr_edit(images, ['Make the sign say "OPEN 24"'] * 2, metadata)
    assert scores == [1.0, 0.0]  # "closed" against "open24": six edits of six letters
    assert scores.info == [{"text": "OPEN 24", "target": "open24"}, {"text": "CLOSED", "target": "OPEN 24"}]
    with pytest.raises(ValueError, match=r'ocr_edit: metadata\[1\] has no "target_text" \(1 samples without\)'):
        ocr_edit(images, ["a", 'say "OPEN 24"'], [metadata[0], {"target_text": ""}])


def test_pixel_preservation_outside_the_mask(tmp_path):
    source = flat(0.2, 0.2, 0.2)
    edited = source.clone()
    edited[:, :4, :4] = 0.6  # a quarter of the image changed by 0.4
    mask = torch.zeros(8, 8)
    mask[:4, :4] = 1
    (tmp_path / "mask.png").write_bytes(to_png(mask[None]))
    cases = [
        (edited, {}, 1 - 0.4 / 4),
        (source, {}, 1.0),
        (flat(0.8, 0.8, 0.8), {}, 1 - 0.6),  # further from the source: lower
        (edited, {"mask": mask}, 1.0),
        (edited, {"mask": to_png(mask[None])}, 1.0),
        (edited, {"mask": str(tmp_path / "mask.png")}, 1.0),
        (edited, {"mask": mask.repeat_interleave(2, 0).repeat_interleave(2, 1)}, 1.0),  # resized to the result
        (edited, {"mask": 1 - mask}, 0.6),  # only the changed quarter is compared
        (edited, {"mask": torch.ones(8, 8)}, 1.0),  # nothing to preserve
    ]
    images = torch.stack([image for image, _, _ in cases])
    metadata = [{"sources": [source], **meta} for _, meta, _ in cases]
    assert pixel_preservation(images, [""] * len(cases), metadata) == pytest.approx([v for _, _, v in cases])
    images = torch.stack([flat(0.2, 0.6, 0.4), flat(0.2, 0.6, 0.4)])  # channels of mean 0.4
    sources = [[flat(0.4, size=(16, 12))], [flat(0.2, 0.6, 0.4), flat(0.9, 0.9, 0.9)]]  # grayscale, another size
    values = pixel_preservation(images, ["", ""], [{"sources": s} for s in sources])
    assert values == pytest.approx([1.0, 1.0], abs=1e-6)  # compared in grayscale, the first source only
    with pytest.raises(ValueError, match=r'pixel_preservation.*metadata\[1\]\["sources"\] is None'):
        pixel_preservation(images, ["", ""], [{"sources": [source]}, {}])
    with pytest.raises(ValueError, match=r'metadata\[0\]\["mask"\] is 0.5; give a tensor'):
        pixel_preservation(images[:1], [""], [{"sources": [source], "mask": 0.5}])


def test_sources_through_serve_reward_score_as_in_process(tmp_path):
    g = torch.Generator().manual_seed(0)
    noise = lambda *shape: torch.randint(0, 256, shape, generator=g).float() / 255  # 8-bit, as PNG keeps it
    images = noise(4, 3, 16, 16)
    mask = torch.zeros(1, 16, 16)
    mask[:, 4:12, 2:9] = 1
    (tmp_path / "mask.png").write_bytes(to_png(mask))
    metadata = [
        {"sources": [torch.where(noise(1, 16, 16) > 0.5, images[0], noise(3, 16, 16))], "target_text": "x"},
        {"sources": [noise(1, 24, 20)]},  # grayscale, another size
        {"sources": [noise(3, 16, 16), noise(3, 8, 8)], "mask": str(tmp_path / "mask.png")},
        {"sources": [images[3]]},
    ]
    prompts = ["edit one", "edit two", "edit three", "leave it"]
    local = pixel_preservation(images, prompts, metadata)
    command = [sys.executable, "-m", "omnialign", "serve-reward", "pixel_preservation", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "serving reward" in line, line
        url = line.split(" at ")[1].split()[0]
        remote = RemoteReward(url, chunk=3, **FAST)(images, prompts, metadata)  # two requests
        config = RewardConfig(weights={"keep": 1.0}, remote={"keep": url})
        scored = score(images, prompts, metadata, config)
        with pytest.raises(ValueError, match=r"samples 0-0 cannot be sent as JSON .*bytes.* give other images"):
            RemoteReward(url, **FAST)(images[:1], prompts[:1], [{**metadata[0], "mask": to_png(mask)}])
    finally:
        process.kill()
        process.wait()
    assert local[3] == 1.0 and min(local[:3]) < 0.9 and len(set(local)) == 4
    assert list(remote) == local and scored.parts["keep"].tolist() == torch.tensor(local).tolist()


def test_malformed_sources_are_refused_naming_the_entry():
    image = base64.b64encode(to_png(flat(0.5))).decode()
    body = {"images": [image, image], "prompts": ["a", "b"], "metadata": [{}, {"k": 1}]}
    job = parse_request(json.dumps(body | {"sources": [None, [image, image]]}).encode())
    assert "sources" not in job.metadata[0] and job.metadata[1]["k"] == 1
    assert [s.shape for s in job.metadata[1]["sources"]] == [(1, 8, 8)] * 2
    for sources, message in [
        ([image], r"'sources' must be a list of 2 entries, one per prompt"),
        ([None, []], r"sources\[1\] must be a non-empty list of base64 PNG strings, or null"),
        ([None, [image, "bm90IGEgcG5n"]], r"sources\[1\]\[1\] is not a base64-encoded PNG"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_request(json.dumps(body | {"sources": sources}).encode())
    with pytest.raises(ValueError, match=r'metadata\[1\]\["sources"\] holds a str; .*source_images'):
        RemoteReward("http://127.0.0.1:9")(torch.stack([flat(0.5)] * 2), ["a", "b"], [{}, {"sources": ["a.png"]}])
