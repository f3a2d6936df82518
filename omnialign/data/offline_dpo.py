"""`omnialign prepare offline-dpo` and its reader: best-versus-worst-of-K preference pairs.

Generation (`prepare_offline_dpo`): for each prompt of a prompt file (`data.prompts.read_prompt_file`:
.txt, .json, .jsonl, .parquet), the frozen pipeline samples `rollout.n` candidates by ODE from
fixed seeds; the configured rewards (`reward.*`, in process, at a reward server, or at one this
command launches) score them with the prompt's metadata; the best and the worst become two
adjacent rows, winner first. A prompt whose candidates all score the same is skipped.

OUT_DIR holds `manifest.json` (the settings; a rerun with other settings stops), `images/`
(`{prompt index:06d}_{candidate}.png`, winners and losers only) and `chunk_00000.parquet`,
... (chunk c holds the pairs of prompts [c*chunk_size, (c+1)*chunk_size)). A chunk is written
aside and renamed when complete, so a rerun skips finished chunks and redoes an interrupted one.
Under torchrun each process takes every world-size-th chunk. docs/data.md lists the columns.

Tensors are binary columns of raw C-order bytes, one tensor per row; the column's field metadata
holds its `dtype` and per-row `shape`. Each pair is its own row group, so that the reader fetches
single pairs and parquet's dictionary encoding stores the pair's shared prompt conditions once.

Reading (`PairLoader`): validates every chunk up front and returns `batch.PreferencePairs` of
adjacent winner/loser rows, without the VAE or the text encoders.
"""

import bisect
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tensordict import TensorDict
from tqdm import tqdm

from omnialign.batch import PreferencePairs
from omnialign.config import Config
from omnialign.data.prompts import read_prompt_file
from omnialign.diffusion.sampling import sample
from omnialign.engine import dist
from omnialign.models import LOADERS
from omnialign.models.base import DiffusionPolicy
from omnialign.rewards import Rewards, RewardWorker
from omnialign.rewards.base import to_pil
from omnialign.rollout.diffusion import sample_seeds

STORE_DTYPES = {"float16": torch.float16, "float32": torch.float32}
CONFIG_KEYS = (
    "seed",
    "model.",
    "reward.",
    "rollout.n",
    "rollout.steps",
    "rollout.height",
    "rollout.width",
    "rollout.guidance",
    "rollout.cfg_rescale",
    "rollout.negative_prompt",
    "rollout.micro_batch_size",
)
"""The config keys `prepare offline-dpo` reads (a trailing dot: every key below it)."""
ROLLOUT_KEYS = ("n", "steps", "height", "width", "guidance", "cfg_rescale", "negative_prompt")
PAIR_COLUMNS = ("prompt_index", "winner", "seed", "score", "latents")
"""Columns the reader needs, besides at least one `cond_*` tensor column."""


def chunk_name(index: int) -> str:
    return f"chunk_{index:05d}.parquet"


# ---------------------------------------------------------------- tensors as parquet columns


def tensor_column(name: str, tensor: torch.Tensor, store_dtype: torch.dtype) -> tuple[pa.Field, pa.Array]:
    """A (N, *shape) tensor as a binary column of N rows; floats are stored as `store_dtype`."""
    tensor = tensor.detach().cpu()
    array = (tensor.to(store_dtype) if tensor.is_floating_point() else tensor).contiguous().numpy()
    meta = {"dtype": str(array.dtype), "shape": json.dumps(list(array.shape[1:]))}
    return pa.field(name, pa.binary(), metadata=meta), pa.array([row.tobytes() for row in array], pa.binary())


def tensor_spec(path: Path, field: pa.Field) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, per-row shape) of a tensor column from its field metadata; ValueError naming the file otherwise."""
    meta = field.metadata or {}
    try:
        return np.dtype(meta[b"dtype"].decode()), tuple(json.loads(meta[b"shape"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"{path}: tensor column {field.name!r} lacks valid 'dtype' and 'shape' field metadata "
            f"({type(e).__name__}: {e}); write it with `omnialign prepare offline-dpo`"
        ) from None


def check_lengths(path: Path, name: str, column: pa.ChunkedArray, spec: tuple, rows: list[int] | None = None) -> None:
    """Every row of a tensor column holds prod(shape) items of its dtype; ValueError naming the row
    of the file (`rows`: the file row of each entry, when the column holds only some) otherwise."""
    dtype, shape = spec
    expected = math.prod(shape) * dtype.itemsize
    lengths = pc.binary_length(column).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(lengths != expected)
    if len(bad):
        row = int(bad[0]) if rows is None else rows[bad[0]]
        raise ValueError(
            f"{path} row {row}: column {name!r} holds {lengths[bad[0]]} bytes, but its stored shape "
            f"{list(shape)} of {dtype} needs {expected}; the file is damaged or was written with "
            "another shape: regenerate it"
        )


def decode(column: pa.ChunkedArray, spec: tuple) -> torch.Tensor:
    """A checked tensor column as (N, *shape); floats as float32."""
    dtype, shape = spec
    array = np.frombuffer(b"".join(column.to_pylist()), dtype).reshape(len(column), *shape)
    tensor = torch.from_numpy(array.copy())
    return tensor.float() if tensor.is_floating_point() else tensor


# ---------------------------------------------------------------- generation


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
        guidance=r.guidance,
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
    policy.transformer.requires_grad_(False).eval().to(world.device)
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
                    negative if r.guidance != 1.0 else None,
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


def write_chunk(
    path: Path, chunk: list[tuple[dict, torch.Tensor, TensorDict]], negative: TensorDict, store: torch.dtype
) -> None:
    """Write one chunk's (row, latent, conditions) aside, one row group per pair, then rename it into place."""
    table = pa.Table.from_pylist([row for row, _, _ in chunk])
    if chunk:
        n = len(chunk)
        tensors = {"latents": torch.stack([latent for _, latent, _ in chunk])}
        tensors.update({f"cond_{k}": v for k, v in torch.stack([cond for _, _, cond in chunk]).items()})
        tensors.update({f"uncond_{k}": v for k, v in negative.expand(n).items()})
        for name, tensor in tensors.items():
            table = table.append_column(*tensor_column(name, tensor, store))
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, row_group_size=2)
    os.replace(tmp, path)


# ---------------------------------------------------------------- reading


class PairLoader:
    """The pairs of `prepare offline-dpo` chunks: `len(loader)` pairs, `read(pair ids)` -> `PreferencePairs`.

    path is an OUT_DIR of chunks, one parquet file, or a list of files. Every file is checked up
    front: the needed columns (`PAIR_COLUMNS`, `cond_*`), tensor dtype/shape metadata, an even
    number of rows alternating winner then loser of one prompt, finite scores with the winner's
    >= the loser's, latents of the stored shape (and of `latent_shape` when given), and the same
    tensor columns in every file. Conditions are checked against their stored shape as they are read.
    """

    def __init__(self, path: str | Path | Sequence[str | Path], latent_shape: Sequence[int] | None = None):
        if isinstance(path, (str, Path)) and Path(path).is_dir():
            files = sorted(Path(path).glob("chunk_*.parquet"))
            if not files:
                raise FileNotFoundError(
                    f"{path} holds no chunk_*.parquet files; write them with "
                    "`omnialign prepare offline-dpo PROMPTS OUT_DIR`"
                )
        else:
            files = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
        self.files: list[Path] = []
        self.groups: list[list[int]] = []  # per file: the first row of each row group, then the row count
        self.starts = [0]  # first global row of each file
        self.spec: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        for file in files:
            parquet = pq.ParquetFile(file)
            if parquet.metadata.num_rows == 0:  # a chunk whose prompts all tied
                continue
            spec = self._check_file(file, parquet)
            if self.spec and spec != self.spec:
                raise ValueError(
                    f"{file}: tensor columns {self._describe(spec)} differ from {self.files[0]}'s "
                    f"{self._describe(self.spec)}; read chunks of one prepare run together"
                )
            self.spec = spec
            sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)]
            self.files.append(file)
            self.groups.append([0, *np.cumsum(sizes).tolist()])
            self.starts.append(self.starts[-1] + parquet.metadata.num_rows)
        if not self.files:
            raise ValueError(f"{path}: no pairs in {len(files)} file(s); every prompt's candidates tied, or none ran")
        if latent_shape is not None and self.spec["latents"][1] != tuple(latent_shape):
            raise ValueError(
                f"{self.files[0]}: latents have shape {list(self.spec['latents'][1])} but this run expects "
                f"{list(latent_shape)}; generate pairs at the run's resolution (rollout.height/width) "
                "with the same model architecture"
            )

    @staticmethod
    def _describe(spec: dict) -> str:
        return ", ".join(f"{k} {list(shape)} {dtype}" for k, (dtype, shape) in spec.items())

    @staticmethod
    def _check_file(file: Path, parquet: pq.ParquetFile) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        schema = parquet.schema_arrow
        names = schema.names
        missing = [c for c in PAIR_COLUMNS if c not in names] + (
            [] if any(n.startswith("cond_") for n in names) else ["cond_*"]
        )
        if missing:
            raise ValueError(
                f"{file}: missing column {missing[0]!r}; columns present: {names}. Pair files are "
                "written by `omnialign prepare offline-dpo`"
            )
        tensors = ["latents"] + [n for n in names if n.startswith(("cond_", "uncond_"))]
        spec = {name: tensor_spec(file, schema.field(name)) for name in tensors}
        rows = parquet.metadata.num_rows
        if rows % 2:
            raise ValueError(
                f"{file}: an odd number of rows ({rows}); pairs are adjacent winner/loser rows, "
                "so the file is incomplete or damaged: regenerate it"
            )
        table = parquet.read(columns=["prompt_index", "winner", "score", "latents"])
        index = table["prompt_index"].to_numpy()
        winner = table["winner"].to_numpy(zero_copy_only=False)
        score = table["score"].to_numpy(zero_copy_only=False).astype(np.float64)
        problems = [
            (
                np.flatnonzero(winner != (np.arange(rows) % 2 == 0)),
                "rows must alternate winner (true) then loser (false)",
            ),
            (np.flatnonzero(~np.isfinite(score)), "the score is NaN or infinite; every image needs a finite score"),
            (2 * np.flatnonzero(index[0::2] != index[1::2]) + 1, "a loser's prompt_index differs from its winner's"),
            (2 * np.flatnonzero(score[0::2] < score[1::2]) + 1, "the loser scores above its winner"),
        ]
        for rows_bad, message in problems:
            if len(rows_bad):
                raise ValueError(f"{file} row {int(rows_bad[0])}: {message}")
        check_lengths(file, "latents", table["latents"], spec["latents"])
        return spec

    def __len__(self) -> int:
        return self.starts[-1] // 2

    def read(self, pairs: Sequence[int]) -> PreferencePairs:
        """The given pairs (ids in [0, len)) as 2*len(pairs) adjacent rows, winner first, in the given order."""
        bad = [p for p in pairs if not 0 <= p < len(self)]
        if bad:
            raise IndexError(f"pair ids {bad[:8]} are outside [0, {len(self)})")
        rows = [row for p in pairs for row in (2 * p, 2 * p + 1)]
        by_file: dict[int, list[tuple[int, int]]] = {}
        for position, row in enumerate(rows):
            f = bisect.bisect_right(self.starts, row) - 1
            by_file.setdefault(f, []).append((position, row - self.starts[f]))
        columns = ["prompt_index", "seed", "score", *self.spec]
        parts, order = [], []
        for f, items in by_file.items():
            starts = self.groups[f]
            group_of = [bisect.bisect_right(starts, row) - 1 for _, row in items]
            needed = sorted(set(group_of))
            offset = dict(zip(needed, np.cumsum([0] + [starts[g + 1] - starts[g] for g in needed]).tolist()))
            take = [offset[g] + row - starts[g] for (_, row), g in zip(items, group_of)]
            table = pq.ParquetFile(self.files[f]).read_row_groups(needed, columns=columns).take(take)
            part = {}
            for name, spec in self.spec.items():
                check_lengths(self.files[f], name, table[name], spec, [row for _, row in items])
                part[name] = decode(table[name], spec)
            part["group"] = torch.from_numpy(table["prompt_index"].to_numpy().astype(np.int64))
            part["scores"] = torch.from_numpy(table["score"].to_numpy().astype(np.float32))
            part["seeds"] = torch.from_numpy(table["seed"].to_numpy().astype(np.int64))
            parts.append(part)
            order += [position for position, _ in items]
        inverse = torch.from_numpy(np.argsort(order))
        t = {k: torch.cat([part[k] for part in parts])[inverse] for k in parts[0]}
        n = len(rows)
        conditions = lambda prefix: TensorDict(
            {k[len(prefix) :]: v for k, v in t.items() if k.startswith(prefix)}, batch_size=[n]
        )
        return PreferencePairs(
            latents=t["latents"],
            cond=conditions("cond_"),
            uncond=conditions("uncond_") if any(k.startswith("uncond_") for k in t) else None,
            group=t["group"],
            scores=t["scores"],
            seeds=t["seeds"],
            batch_size=[n],
        )

    def batches(self, pairs_per_batch: int, seed: int | None = None) -> Iterator[PreferencePairs]:
        """One pass over every pair, `pairs_per_batch` at a time (the last batch may be smaller);
        shuffled by `seed`, in file order when seed is None."""
        order = (
            torch.arange(len(self))
            if seed is None
            else torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
        )
        for lo in range(0, len(self), pairs_per_batch):
            yield self.read(order[lo : lo + pairs_per_batch].tolist())
