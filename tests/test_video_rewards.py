"""Video rewards: image rewards per frame (reward.per_frame), temporal consistency on pixels and on a tiny random
CLIP, the VLM judge over sampled frames (a loopback chat endpoint), and videos through serve-reward."""

import base64
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from http_stub import JSONHandler, serving
from test_preference_rewards import build_clip

from omnialign.config import GROUP_WISE_REWARDS, ConfigError, RewardConfig, apply_overrides, validate
from omnialign.recipes import RECIPES
from omnialign.rewards import REWARDS, RewardError, RewardWorker, score
from omnialign.rewards.base import Scores, from_png, to_png
from omnialign.rewards.client import RemoteReward, RewardServerError, post_json
from omnialign.rewards.jpeg import jpeg_compressibility
from omnialign.rewards.pairwise import pairwise_win_rate
from omnialign.rewards.preference import load_clip, pixels
from omnialign.rewards.server import RewardServer
from omnialign.rewards.video import per_frame, temporal_consistency, vlm_video

FNS = Path(__file__).parent / "reward_fns.py"
FAST = {"backoff": 0.01, "max_backoff": 0.05}


def flat(values: list[list[float]], channels: int = 1, size: int = 4) -> torch.Tensor:
    """Videos (B, F, C, size, size) whose frame (b, f) is the constant values[b][f]."""
    return torch.tensor(values)[:, :, None, None, None].expand(-1, -1, channels, size, size).contiguous()


def random_videos(b: int, f: int, seed: int = 0, size: int = 24) -> torch.Tensor:
    """Random 8-bit RGB videos in [0, 1] (as they arrive at a server)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, f, 3, size, size + 8, generator=g).mul(255).round().div(255)


def mean_pixel(outputs, prompts, metadata):
    return [float(image.mean()) for image in outputs]


def frame_echo(outputs, prompts, metadata):
    """Each frame's index plus its sample's "k", and what it was given, in info."""
    info = [{"frame": m["frame"], "prompt": p, "shape": list(o.shape)} for o, p, m in zip(outputs, prompts, metadata)]
    return Scores([m["frame"] + m["k"] for m in metadata], info)


# ------------------------------------------------------------------------------------------------- per_frame


def test_per_frame_mean_and_min_by_hand():
    videos = flat([[0.25, 0.5, 1.0], [1.0, 0.0, 0.5]])
    mean = per_frame(mean_pixel, "mean_pixel", "mean")(videos, ["a", "b"], [{}, {}])
    low = per_frame(mean_pixel, "mean_pixel", "min")(videos, ["a", "b"], [{}, {}])
    assert mean == pytest.approx([1.75 / 3, 0.5]) and low == [0.25, 0.0]
    assert mean.info == [{"frames": [0.25, 0.5, 1.0]}, {"frames": [1.0, 0.0, 0.5]}]


def test_per_frame_gives_each_frame_its_index_prompt_and_metadata():
    videos = torch.rand(2, 3, 3, 8, 6)
    scores = per_frame(frame_echo, "echo", "mean")(videos, ["a", "b"], [{"k": 0}, {"k": 10}])
    assert scores == [1.0, 11.0]
    assert scores.info[1]["frames"] == [10.0, 11.0, 12.0]
    assert scores.info[1]["frame_info"] == [{"frame": i, "prompt": "b", "shape": [3, 8, 6]} for i in range(3)]


def test_per_frame_jpeg_equals_jpeg_of_each_frame():
    videos = random_videos(3, 4, seed=1)
    scores = per_frame(jpeg_compressibility, "jpeg_compressibility", "min")(videos, ["p"] * 3, [{}] * 3)
    by_frame = [jpeg_compressibility(video, ["p"] * 4, [{}] * 4) for video in videos]
    assert scores == [min(s) for s in by_frame] and [i["frames"] for i in scores.info] == by_frame


def test_wrong_shapes_fail_naming_the_reward_and_the_fix():
    images, videos = torch.rand(2, 3, 8, 8), torch.rand(2, 3, 3, 8, 8)
    with pytest.raises(
        ValueError, match=r"'per_frame\(mean_pixel\)' scores videos \(B, F, 1 or 3, H, W\).*\(2, 3, 8, 8\)"
    ):
        per_frame(mean_pixel, "mean_pixel", "mean")(images, ["a", "b"], [{}, {}])
    config = RewardConfig(weights={"jpeg_compressibility": 1.0})
    fix = r'to score each frame of videos, set reward.per_frame=\{"jpeg_compressibility": "mean"\}'
    with pytest.raises(
        RewardError, match=rf"'jpeg_compressibility' failed: .*scores images .*\(2, 3, 3, 8, 8\); {fix}"
    ):
        score(videos, ["a", "b"], [{}, {}], config)
    with pytest.raises(RewardError, match="'temporal_consistency' failed: .*scores videos"):
        score(images, ["a", "b"], [{}, {}], RewardConfig(weights={"temporal_consistency": 1.0}))


def test_per_frame_through_the_config_score_and_the_worker(tmp_path):
    file = tmp_path / "mine.py"
    file.write_text("def bright(outputs, prompts, metadata, offset=0.0):\n"
                    "    return [float(x.mean()) + offset for x in outputs]\n")  # fmt: skip
    name = f"{file}:bright"
    videos = flat([[0.25, 0.75], [0.5, 1.0]], channels=3)
    config = RewardConfig(weights={name: 2.0, "temporal_consistency": 1.0}, options={name: {"offset": 1.0}},
                          per_frame={name: "min"}, gold=name)  # fmt: skip
    expected = score(videos, ["a", "b"], [{}, {}], config)
    assert expected.parts[name].tolist() == [1.25, 1.5]
    assert expected.parts["temporal_consistency"].tolist() == [0.5, 0.5]
    assert expected.total.tolist() == [3.0, 3.5] and expected.info[0][name] == {"frames": [1.25, 1.75]}
    with RewardWorker(config) as worker:
        result = worker.submit(videos, ["a", "b"], [{}, {}]).result(timeout=30)
        assert worker.gold(videos, ["a", "b"], [{}, {}]) == [1.25, 1.5]  # the gold judge is framed too
    assert torch.equal(result.total, expected.total)


def test_per_frame_config_errors_name_the_field():
    videos = flat([[0.0, 1.0]])
    stray = RewardConfig(weights={"jpeg_compressibility": 1.0}, per_frame={"ocr": "mean"})
    for call in (lambda: score(videos, ["a"], [{}], stray), lambda: RewardWorker(stray)):
        with pytest.raises(ValueError, match=r"reward.per_frame names \['ocr'\], which neither reward.weights"):
            call()
    bad = RewardConfig(weights={"jpeg_compressibility": 1.0}, per_frame={"jpeg_compressibility": "max"})
    for call in (lambda: score(videos, ["a"], [{}], bad), lambda: RewardWorker(bad)):
        with pytest.raises(ValueError, match=r"reward.per_frame\['jpeg_compressibility'\]='max': .* \('mean', 'min'\)"):
            call()


def test_a_group_wise_reward_per_frame_is_refused_naming_the_field_the_value_and_the_fix():
    """The frames of one video would compete with each other: config.validate refuses the combination."""
    per_frame = '{"pairwise_vlm": "mean", "ocr": "mean"}'
    options = '{"pairwise_vlm": {"url": "http://127.0.0.1:1/v1", "model": "m"}}'
    for recipe, weights in (("glyphs_video", '{"glyph_video": 1, "pairwise_vlm": 1, "ocr": 0}'),
                            ("wan21_t2v_1_3b_ocr_flowgrpo_lora", '{"ocr": 1, "pairwise_vlm": 1}')):  # fmt: skip
        config = apply_overrides(RECIPES[recipe](), [f"reward.weights={weights}", f"reward.per_frame={per_frame}",
                                                     f"reward.options={options}"])  # fmt: skip
        with pytest.raises(ConfigError) as error:
            validate(config)
        message = str(error.value)
        assert message.startswith("reward.per_frame={'pairwise_vlm': 'mean', 'ocr': 'mean'}: 'pairwise_vlm' is "
                                  "group-wise (it compares the samples of a prompt group with each other)")  # fmt: skip
        fix = "remove 'pairwise_vlm' from reward.per_frame and judge videos with a video reward such as vlm_video"
        assert "frames of one video compete with each other" in message and fix in message
        config.reward.per_frame = {"ocr": "mean"}  # scored per video (not per frame), it passes
        validate(config)
    assert set(GROUP_WISE_REWARDS) <= set(REWARDS)


def test_frames_carry_no_group_so_a_group_wise_reward_per_frame_fails_saying_why():
    """A group-wise reward config cannot name (a file, a remote one) fails on its first call instead of scoring
    the frames of one video against each other; an ordinary per-frame reward sees the rest of the metadata."""
    videos = flat([[0.0, 1.0], [0.5, 0.5]])
    scores = per_frame(frame_echo, "echo", "mean")(videos, ["a", "b"], [{"k": 0, "group": 3}, {"k": 1, "group": 3}])
    assert scores == [0.5, 1.5] and [info["frame"] for info in scores.info[0]["frame_info"]] == [0, 1]
    seen = []
    look = per_frame(lambda o, p, m: seen.extend(m) or [0.0] * len(o), "look", "min")
    look(videos, ["a", "b"], [{"group": 3}, {"group": 3}])
    assert seen == [{"frame": 0}, {"frame": 1}, {"frame": 0}, {"frame": 1}]

    def win_rate(outputs, prompts, metadata):
        return pairwise_win_rate(lambda a, b, prompt: 1.0, outputs, prompts, metadata, reward="win_rate")

    with pytest.raises(
        ValueError,
        match=r"'win_rate' compares .* metadata\[0\] has no \"group\": .*not on the "
        r"frames of reward.per_frame.*take this reward out of reward.per_frame",
    ):
        per_frame(win_rate, "win_rate", "mean")(videos, ["a", "b"], [{"group": 3}, {"group": 3}])
    with pytest.raises(ValueError, match=r"'win_rate' compares images .*not videos \(2, 2, 1, 4, 4\); a group-wise"):
        win_rate(videos, ["a", "b"], [{"group": 3}, {"group": 3}])


# -------------------------------------------------------------------------------------- temporal consistency


def test_temporal_consistency_on_pixels_by_hand():
    still = random_videos(2, 1).expand(-1, 5, -1, -1, -1)
    assert temporal_consistency(still, ["a", "b"], [{}, {}]) == [1.0, 1.0]
    # frames 0, 0.5, 1: i=1: (0.5 + 0.5) / 2; i=2: (0 + 0.5) / 2; a flicker 0, 1, 0: i=1: 0, i=2: (1 + 0) / 2
    scores = temporal_consistency(flat([[0.0, 0.5, 1.0], [0.0, 1.0, 0.0]], channels=3), ["a", "b"], [{}, {}])
    assert scores == [0.375, 0.25]
    assert scores.info == [{"first": 0.25, "previous": 0.5}, {"first": 0.5, "previous": 0.0}]
    with pytest.raises(ValueError, match="compares frames; got videos of 1 frame"):
        temporal_consistency(still[:, :1], ["a", "b"], [{}, {}])
    assert REWARDS["temporal_consistency"] is temporal_consistency


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return build_clip(tmp_path_factory.mktemp("clip") / "clip", seed=5)


def test_temporal_consistency_on_clip_embeddings_by_hand(clip):
    a, b = random_videos(2, 1, seed=2)[:, 0]
    model, _, processor = load_clip(clip, None, "cpu")
    e = model.get_image_features(pixel_values=pixels(torch.stack([a, b]), processor, "cpu")).pooler_output
    cos = max(0.0, float(torch.cosine_similarity(e[0], e[1], dim=0)))  # VBench's max(0, cos)
    assert 0 < cos < 0.999  # the twin tells the two images apart
    videos = torch.stack([torch.stack([a, a, a]), torch.stack([a, b, a])])
    scores = temporal_consistency(videos, ["x", "y"], [{}, {}], path=clip)
    # [a, b, a]: i=1: (cos(b, a) + cos(b, a)) / 2; i=2: (cos(a, a) + cos(a, b)) / 2
    assert scores == pytest.approx([1.0, (cos + (1 + cos) / 2) / 2], abs=1e-5)
    assert scores.info[1] == pytest.approx({"first": (cos + 1) / 2, "previous": cos}, abs=1e-5)
    with pytest.raises(ValueError, match=r"reward 'temporal_consistency': path='/nope' is not a folder"):
        temporal_consistency(videos, ["x", "y"], [{}, {}], path="/nope")


# -------------------------------------------------------------------------------- VLM judge of sampled frames


class FrameJudge(ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint that reads frames of constant brightness k / 10 as the numbers k:
    alignment = how many images came, coherence 5 if their numbers rise and 1 otherwise, style 3."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FrameJudgeHandler)
        self.seen, self.lock = [], threading.Lock()


class FrameJudgeHandler(JSONHandler):
    server: FrameJudge

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = body["messages"][0]["content"]
        urls = [c["image_url"]["url"] for c in content if c["type"] == "image_url"]
        numbers = [round(float(from_png(base64.b64decode(u.split(",", 1)[1])).mean()) * 10) for u in urls]
        question = content[-1]["text"]
        with self.server.lock:
            self.server.seen.append((numbers, question, body))
        rising = all(x < y for x, y in zip(numbers, numbers[1:]))
        reply = f"I see {numbers}.\nAlignment Score: {len(urls)}\nCoherence Score: {5 if rising else 1}\nStyle Score: 3"
        self.answer(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})


def test_vlm_video_sends_evenly_spaced_frames_in_order_in_one_message():
    videos = flat([[k / 10 for k in range(8)], [k / 10 for k in range(7, -1, -1)]], channels=3)
    with serving(FrameJudge()) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        scores = vlm_video(videos, ["count up", "count down"], [{}, {}], url=url, model="judge", concurrency=1)
        seen = sorted(server.seen, key=lambda s: "down" in s[1])
        assert [s[0] for s in seen] == [[0, 2, 5, 7], [7, 5, 2, 0]]  # round(linspace(0, 7, 4))
        question = seen[0][1]
        assert question.startswith("You are presented with 4 frames of one generated video, in order,")
        assert "Text caption: count up\n" in question and seen[0][2]["temperature"] == 0.0
        assert scores == pytest.approx([(0.75 + 1.0 + 0.5) / 3, (0.75 + 0.0 + 0.5) / 3])
        assert scores.info[0]["coherence"] == 1.0 and scores.info[0]["text"].startswith("I see [0, 2, 5, 7]")
        server.seen.clear()
        vlm_video(videos[:1], ["c"], [{}], url=url, model="judge", frames=20, prompt="{frames} frames: {prompt}")
        vlm_video(videos[:1], ["c"], [{}], url=url, model="judge", frames=1)
        assert [s[:2] for s in server.seen][0] == (list(range(8)), "8 frames: c")
        assert server.seen[1][0] == [0]
    with pytest.raises(ValueError, match="frames=0; sample at least 1 frame"):
        vlm_video(videos, ["a", "b"], [{}, {}], url=url, model="judge", frames=0)
    assert REWARDS["vlm_video"] is vlm_video


# ------------------------------------------------------------------------------------ videos over serve-reward


def test_a_video_reward_served_scores_like_in_process_and_requests_count_frames():
    videos = random_videos(5, 3, seed=3)
    prompts, metadata = [f"p{i}" for i in range(5)], [{}] * 5
    with RewardServer(temporal_consistency, "temporal_consistency", port=0) as server:
        scores = RemoteReward(server.url, chunk=6, **FAST)(videos, prompts, metadata)  # 2 videos of 3 frames a request
        health = server.health()
    expected = temporal_consistency(videos, prompts, metadata)
    assert scores == pytest.approx(expected, abs=1e-6)
    assert [i["first"] for i in scores.info] == pytest.approx([i["first"] for i in expected.info], abs=1e-6)
    assert health["requests"] == 3 and health["samples"] == 5


def test_a_per_frame_remote_image_reward_sends_every_frame():
    videos = random_videos(3, 4, seed=4)
    with RewardServer(mean_pixel, "mean_pixel", port=0) as server:
        config = RewardConfig(weights={"pix": 1.0}, remote={"pix": server.url}, per_frame={"pix": "min"})
        remote = score(videos, ["a", "b", "c"], [{}] * 3, config)
        assert server.health()["samples"] == 12  # B * F images
    local = per_frame(mean_pixel, "mean_pixel", "min")(videos, ["a", "b", "c"], [{}] * 3)
    assert torch.allclose(remote.parts["pix"], torch.tensor(local), atol=1e-6)


def test_the_worker_sends_a_per_frame_remote_reward_from_its_remote_threads(tmp_path):
    file = tmp_path / "waiting.py"
    file.write_text("import threading\n\nARRIVED = threading.Event()\n\n\n"
                    "def waits(outputs, prompts, metadata):\n"
                    "    assert ARRIVED.wait(10), 'the remote reward never ran'\n"
                    "    return [0.0] * len(prompts)\n")  # fmt: skip
    waits, arrived = f"{file}:waits", []

    def served(outputs, prompts, metadata):
        arrived[0].set()  # lets the in-process reward, which holds the worker's local thread, finish
        return mean_pixel(outputs, prompts, metadata)

    videos = random_videos(2, 3, seed=8)
    with RewardServer(served, "pix", port=0) as server:
        config = RewardConfig(weights={waits: 1.0, "pix": 1.0}, remote={"pix": server.url}, per_frame={"pix": "mean"})
        with RewardWorker(config) as worker:
            arrived.append(vars(sys.modules[worker.fns[waits].__module__])["ARRIVED"])
            result = worker.submit(videos, ["a", "b"], [{}, {}]).result(timeout=30)
    local = per_frame(mean_pixel, "mean_pixel", "mean")(videos, ["a", "b"], [{}, {}])
    assert torch.allclose(result.parts["pix"], torch.tensor(local), atol=1e-6)


def test_concurrent_videos_batch_by_length_within_max_batch():
    calls = []

    def recording(outputs, prompts, metadata):
        calls.append(tuple(outputs.shape))
        time.sleep(0.05)  # so that requests pile up
        return temporal_consistency(outputs, prompts, metadata)

    videos = {3: random_videos(6, 3, seed=5), 5: random_videos(6, 5, seed=6)}
    requests = [(f, i) for i in range(6) for f in (3, 5)]
    with RewardServer(recording, "recording", port=0, max_batch=10) as server:
        remote = RemoteReward(server.url, **FAST)
        with ThreadPoolExecutor(12) as clients:
            replies = list(clients.map(lambda r: remote(videos[r[0]][r[1] : r[1] + 1], ["p"], [{}]), requests))
    for (f, i), reply in zip(requests, replies):
        assert reply == pytest.approx(temporal_consistency(videos[f][i : i + 1], ["p"], [{}]), abs=1e-6)
    assert len(calls) < 12 and all(b * f <= 10 for b, f, *_ in calls)  # merged, frames within max_batch


def test_malformed_videos_are_400_naming_the_field():
    png = lambda c: base64.b64encode(to_png(torch.zeros(c, 8, 8))).decode()
    cases = [
        ({"videos": [[png(1)], [png(1), png(1)]], "prompts": ["a", "b"]}, r"'videos' hold \[1, 2\] frames"),
        ({"videos": [[png(1), png(3)]], "prompts": ["a"]}, r"videos\[0\]\[1\] has shape \(3, 8, 8\) but videos\[0\]"),
        ({"videos": [png(1)], "prompts": ["a"]}, "'videos' must be a list of 1 non-empty lists"),
        ({"videos": [["x"]], "prompts": ["a"]}, r"videos\[0\]\[0\] is not a base64-encoded PNG"),
        ({"videos": [[png(1)]], "images": [png(1)], "prompts": ["a"]}, "give exactly one of 'images'"),
    ]  # fmt: skip
    with RewardServer(temporal_consistency, "temporal_consistency", port=0) as server:
        for body, message in cases:
            with pytest.raises(RewardServerError, match=f"HTTP 400: {message}"):
                post_json(f"{server.url}/score", body, retries=0)


def test_serve_reward_command_serves_clip_temporal_consistency(clip):
    videos = random_videos(3, 4, seed=7)
    command = [sys.executable, "-m", "omnialign", "serve-reward", "temporal_consistency", "--port", "0",
               "--options", json.dumps({"path": clip})]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "serving reward" in line, line
        url = line.split(" at ")[1].split()[0]
        scores = RemoteReward(url, chunk=4, **FAST)(videos, ["a", "b", "c"], [{}] * 3)
    finally:
        process.kill()
        process.wait()
    assert scores == pytest.approx(temporal_consistency(videos, ["a", "b", "c"], [{}] * 3, path=clip), abs=1e-5)


def test_an_image_reward_on_videos_points_at_per_frame():
    """glyph_ocr given videos (B, F, C, H, W) says to set reward.per_frame (it was a raw conv2d error)."""
    from omnialign.worlds.glyphs.recognizer import glyph_ocr

    with pytest.raises(ValueError, match=r"'glyph_ocr' scores images .*reward.per_frame=\{\"glyph_ocr\": \"mean\"\}"):
        glyph_ocr(torch.zeros(2, 4, 1, 32, 32), ["1", "2"], [{}, {}])
