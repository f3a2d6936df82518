"""`omnialign prepare offline-dpo`: best-versus-worst-of-K preference pairs, generated and scored.

For each prompt of a prompt file (`data.prompts.read_prompt_file`: .txt, .json, .jsonl, .parquet),
the frozen pipeline samples `rollout.n` candidates by ODE from fixed seeds; the configured rewards
(`reward.*`, in process, at a reward server, or at one this command launches) score them with the
prompt's metadata; the best and the worst become two adjacent rows, winner first. A prompt whose
candidates all score the same is skipped.

The files (`manifest.json`, `images/`, `chunk_*.parquet`) and their reader are `data.offline_dpo`. A
rerun with other settings than the manifest's stops; a rerun with the same skips finished chunks and
redoes an interrupted one. Under torchrun each process takes every world-size-th chunk.
"""

import dataclasses
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from tensordict import TensorDict
from tqdm import tqdm

from omnialign.config import Config
from omnialign.data.offline_dpo import STORE_DTYPES, chunk_name, write_chunk
from omnialign.data.prompts import read_prompt_file
from omnialign.diffusion.sampling import sample
from omnialign.engine import dist
from omnialign.models import LOADERS
from omnialign.models.base import DiffusionPolicy
from omnialign.rewards import Rewards, RewardWorker
from omnialign.rewards.base import to_pil
from omnialign.rollout.diffusion import sample_seeds, step_guidance, uses_cfg

CONFIG_KEYS = (
    "seed",
    "model.",
    "reward.",
    "rollout.n",
    "rollout.steps",
    "rollout.height",
    "rollout.width",
    "rollout.guidance",
    "rollout.guidance_2",
    "rollout.cfg_rescale",
    "rollout.negative_prompt",
    "rollout.micro_batch_size",
)
"""The config keys `prepare offline-dpo` reads (a trailing dot: every key below it)."""
ROLLOUT_KEYS = ("n", "steps", "height", "width", "guidance", "cfg_rescale", "negative_prompt")


def check_keys(overrides: list[str]) -> None:
    """Reject config overrides that `prepare offline-dpo` would ignore."""
    for item in overrides:
        key = item.partition("=")[0]
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in CONFIG_KEYS):
            raise ValueError(
                f"{key!r} is not a setting of this command; drop it. It reads {', '.join(CONFIG_KEYS)} "
                "(a trailing dot: every key below it)"
            )


def manifest_of(prompts: list[str], config: Config, chunk_size: int, store_dtype: str) -> dict:
    """The settings that fix every row, by dotted key; a rerun must match them to resume."""
    r = config.reward
    manifest = {
        "prompts": len(prompts),
        "prompts_sha256": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "chunk_size": chunk_size,
        "store_dtype": store_dtype,
        "seed": config.seed,
        **{f"model.{k}": v for k, v in dataclasses.asdict(config.model).items()},
        **{f"rollout.{k}": v for k, v in dataclasses.asdict(config.rollout).items() if k in ROLLOUT_KEYS},
        "reward.weights": r.weights,
        "reward.optional": r.optional,
        "reward.options": r.options,
    }
    return json.loads(json.dumps(manifest))  # as it reads back


def check_manifest(out_dir: Path, manifest: dict) -> None:
    """Write OUT_DIR/manifest.json, or check that the one there has the same settings."""
    path = out_dir / "manifest.json"
    if path.exists():
        old = json.loads(path.read_text())
        changed = [f"{k}={old.get(k)!r} there, {v!r} now" for k, v in manifest.items() if old.get(k) != v]
        if changed:
            raise ValueError(
                f"{out_dir} was written with other settings ({'; '.join(changed)}). Rerun with the "
                "same prompts and settings to resume, or choose a new OUT_DIR"
            )
        return
    tmp = path.with_name(f"manifest.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, path)


@contextmanager
def reward_server(name: str, options: dict) -> Iterator[str]:
    """Run `omnialign serve-reward NAME` on a free loopback port; yields its URL and stops it on exit."""
    command = [sys.executable, "-m", "omnialign", "serve-reward", name, "--port", "0", "--options", json.dumps(options)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:  # until it prints its URL
            if line.startswith("serving reward") and " at http" in line:
                break
            sys.stdout.write(line)
        else:
            raise RuntimeError(
                f"--serve-reward {name}: `{' '.join(command)}` did not start (exit code "
                f"{process.wait(timeout=30)}); its error is printed above"
            )
        # keep its later output flowing, so that a full pipe never blocks it
        threading.Thread(target=shutil.copyfileobj, args=(process.stdout, sys.stdout), daemon=True).start()
        yield line.split(" at ")[1].split()[0]
    finally:
        process.terminate()
        process.wait()


@torch.no_grad()
def candidates(
    policy: DiffusionPolicy,
    prompts: list[str],
    seeds: torch.Tensor,
    uncond: TensorDict | None,
    config: Config,
    device: torch.device,
) -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
    """`rollout.n` ODE samples of each prompt: conditions (P), final latents (P*n, *latent), images (P*n, C, H, W)."""
    r = config.rollout
    cond = policy.encode_prompts(prompts)
    repeated = cond[torch.arange(len(prompts), device=cond.device).repeat_interleave(r.n)]
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    out = sample(
        policy.velocity,
        generators,
        policy.latent_shape(r.height, r.width),
        policy.schedule(r.steps, r.height, r.width),
        repeated,
        None if uncond is None else uncond.expand(len(seeds)),
        guidance=lambda sigma: step_guidance(policy, sigma, r),
        cfg_rescale=r.cfg_rescale,
        device=device,
    )
    return cond, out.final, policy.decode(out.final)


def pair_rows(
    ids: list[int], prompts: list[str], metadata: list[dict], seeds: torch.Tensor, scored: Rewards, n: int
) -> list[tuple[int, dict]]:
    """(sample position in the batch, row) of the winner then the loser of each prompt of a scored
    batch (`n` candidates per prompt); a prompt whose candidates all tie gives none."""
    totals = scored.total.view(len(ids), n)
    out = []
    for p, i in enumerate(ids):
        if totals[p].max() == totals[p].min():
            continue
        for k, winner in ((int(totals[p].argmax()), True), (int(totals[p].argmin()), False)):
            s = p * n + k
            row = {
                "prompt": prompts[i],
                "prompt_index": i,
                "winner": winner,
                "candidate": k,
                "seed": int(seeds[i, k]),
                "score": float(totals[p, k]),
                "image": f"images/{i:06d}_{k}.png",
                "candidate_scores": totals[p].tolist(),
                "candidate_seeds": seeds[i].tolist(),
                "score_parts": json.dumps({name: float(part[s]) for name, part in scored.parts.items()}),
                "reward_info": json.dumps(scored.info[s]),
                "metadata": json.dumps(metadata[i]),
            }
            out.append((s, row))
    return out


def prepare_offline_dpo(
    prompt_file: str | Path,
    out_dir: str | Path,
    config: Config,
    chunk_size: int = 64,
    store_dtype: str = "float16",
    serve: Sequence[str] = (),
    progress: bool = True,
) -> dict[str, int]:
    """Generate, score and write the pairs of every prompt not yet written (see the module doc).

    config supplies the model (`model.*`), sampling (`rollout.n` candidates, `rollout.steps` ODE
    steps, height, width, guidance, cfg_rescale, negative_prompt, micro_batch_size samples per
    forward), `seed` and the rewards (`reward.*`); each name in `serve` (a key of reward.weights)
    is scored by an `omnialign serve-reward` process started here. Returns counts: prompts
    generated, pairs written, prompts skipped (all candidates tied), chunks written and chunks
    already done.
    """
    r = config.rollout
    checks = [
        (r.n >= 2, f"rollout.n={r.n}: need at least 2 candidates per prompt to pick a best and a worst"),
        (chunk_size >= 1, f"--chunk-size {chunk_size}: must be at least 1"),
        (store_dtype in STORE_DTYPES, f"--store-dtype {store_dtype}: choose {' or '.join(STORE_DTYPES)}"),
        (config.model.arch in LOADERS, f"model.arch={config.model.arch!r}: choose one of {sorted(LOADERS)}"),
    ]
    checks += [
        (
            name in config.reward.weights and name not in config.reward.remote,
            f"--serve-reward {name}: name a key of reward.weights {sorted(config.reward.weights)} that is not "
            "already in reward.remote",
        )
        for name in serve
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    prompts, metadata = read_prompt_file(prompt_file)
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    check_manifest(out_dir, manifest_of(prompts, config, chunk_size, store_dtype))
    world = dist.init()
    chunks = range(math.ceil(len(prompts) / chunk_size))
    todo = [c for c in chunks if c % world.size == world.rank and not (out_dir / chunk_name(c)).exists()]
    counts = {"generated": 0, "pairs": 0, "skipped": 0, "chunks": len(todo), "done_before": len(chunks) - len(todo)}
    if not todo:
        return counts
    policy = LOADERS[config.model.arch](config.model)
    for net in (policy.transformer, policy.transformer_2):
        if net is not None:
            net.requires_grad_(False).eval().to(world.device)
    policy.to(world.device)
    negative = policy.encode_prompts([r.negative_prompt])  # stored with every row; used when CFG is on
    seeds = sample_seeds(config.seed, 0, len(prompts) * r.n).view(len(prompts), r.n)
    per_batch = max(1, r.micro_batch_size // r.n)
    total = sum(min(len(prompts), (c + 1) * chunk_size) - c * chunk_size for c in todo)
    bar = tqdm(total=total, desc="offline-dpo", unit="prompt", disable=not (progress and world.is_main))
    with ExitStack() as stack:
        reward = config.reward
        for name in serve:
            url = stack.enter_context(reward_server(name, reward.options.get(name, {})))
            options = {k: v for k, v in reward.options.items() if k != name}
            reward = dataclasses.replace(reward, remote={**reward.remote, name: url}, options=options)
        worker = stack.enter_context(RewardWorker(reward))

        def keep(ids: list[int], cond: TensorDict, final: torch.Tensor, images: torch.Tensor, future, chunk) -> None:
            """Add the best and the worst candidate of each prompt of a scored batch to the chunk."""
            picked = pair_rows(ids, prompts, metadata, seeds, future.result(), r.n)
            for s, row in picked:
                to_pil(images[s]).save(out_dir / row["image"])
                chunk.append((row, final[s], cond[s // r.n]))
            counts["skipped"] += len(ids) - len(picked) // 2
            bar.update(len(ids))

        for c in todo:
            chunk, pending = [], None
            first, stop = c * chunk_size, min(len(prompts), (c + 1) * chunk_size)
            for lo in range(first, stop, per_batch):
                ids = list(range(lo, min(stop, lo + per_batch)))
                cond, final, images = candidates(
                    policy,
                    [prompts[i] for i in ids],
                    seeds[ids].flatten(),
                    negative if uses_cfg(r) else None,
                    config,
                    world.device,
                )
                cond, final, images = cond.cpu(), final.cpu(), images.cpu()
                future = worker.submit(
                    images,
                    [prompts[i] for i in ids for _ in range(r.n)],
                    [metadata[i] for i in ids for _ in range(r.n)],
                )
                if pending:  # it was scored while this batch was generated
                    keep(*pending, chunk)
                pending = (ids, cond, final, images, future)
            keep(*pending, chunk)
            write_chunk(out_dir / chunk_name(c), chunk, negative.cpu(), STORE_DTYPES[store_dtype])
            counts["generated"] += stop - first
            counts["pairs"] += len(chunk) // 2
    bar.close()
    return counts
