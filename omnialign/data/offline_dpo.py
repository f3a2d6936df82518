"""The stored preference pairs of `omnialign prepare offline-dpo`: their parquet format, writer and reader.

The pairs are generated and scored by `omnialign.prepare.offline_dpo`; this module knows only the files.
OUT_DIR holds `manifest.json` (the settings of the run that wrote it), `images/` (winners and losers)
and `chunk_00000.parquet`, ... (chunk c holds the pairs of prompts [c*chunk_size, (c+1)*chunk_size)),
each written aside and renamed when complete (`write_chunk`). docs/data.md lists the columns.

Tensors are binary columns of raw C-order bytes, one tensor per row; the column's field metadata
holds its `dtype` and per-row `shape`. Each pair is its own row group, so that the reader fetches
single pairs and parquet's dictionary encoding stores the pair's shared prompt conditions once.

Reading (`PairLoader`): validates every chunk up front and returns `batch.PreferencePairs` of
adjacent winner/loser rows, without the VAE or the text encoders.
"""

import bisect
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tensordict import TensorDict

from omnialign.batch import PreferencePairs

STORE_DTYPES = {"float16": torch.float16, "float32": torch.float32}
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
            try:
                parquet = pq.ParquetFile(file)
            except pa.ArrowException as e:  # a chunk cut short (a copy that stopped), or not parquet at all
                fix = "copy it again, or delete it and rerun `omnialign prepare offline-dpo` on the folder"
                raise ValueError(f"{file}: not a readable parquet file ({e}); {fix}") from None
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
