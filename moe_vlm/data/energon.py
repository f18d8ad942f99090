"""The on-disk format Megatron Energon reads: WebDataset tar shards plus `.nv-meta/`.

    DIR/
      shard_000000.tar          <key>.jpg  <key>.txt  <key>.json   (one sample = one key)
      shard_000000.tar.idx      byte offset of each sample, then the end offset (uint64, Energon's index)
      .nv-meta/
        dataset.yaml            ChatMLWebdataset: what Bridge's Qwen-VL task encoder consumes
        captioning.yaml         plain Energon CaptioningSample (image + caption), no Bridge needed
        split.yaml              split_parts: {train: [shards], val: [], test: []}
        .info.yaml              shard_counts: {shard name: samples}

`<key>.txt` is the caption; `<key>.json` is the same caption as a LLaVA-style
conversation ("<image>" placeholder, then the caption as the answer), the form Bridge's
ChatMLWebdataset / QwenVLTaskEncoder expects. This module writes the layout
(scripts/build_dataset.py) and reads it with the standard library's tarfile; it never
needs Energon itself.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moe_vlm.data.errors import DatasetNotFound, ShardError

META_DIR = ".nv-meta"
INFO_YAML = ".info.yaml"
INFO_JSON = ".info.json"  # what newer `energon prepare` writes; read when present
SPLIT_YAML = "split.yaml"
DATASET_YAML = "dataset.yaml"
CAPTIONING_YAML = "captioning.yaml"
IMAGE_PARTS = ("jpg", "jpeg", "png", "webp")
PROMPT = "Describe this image."
# Energon splits a member name at its first dot: the key may not contain one.
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_-]+")

DATASET_SPEC: dict[str, Any] = {
    "__module__": "megatron.bridge.data.energon.task_encoder_utils",
    "__class__": "ChatMLWebdataset",
    "field_map": {"imgs": "jpg", "conversation": "json"},
    "subflavors": {},
}
CAPTIONING_SPEC: dict[str, Any] = {
    "sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"},
    "field_map": {"image": "jpg", "caption": "txt"},
}


def safe_key(name: str) -> str:
    return _UNSAFE_KEY.sub("_", name).strip("_") or "sample"


@dataclass(frozen=True)
class CaptionedImage:
    key: str
    jpeg: bytes
    caption: str


@dataclass(frozen=True)
class Shard:
    name: str  # relative to the dataset directory, as .info.yaml names it
    path: Path
    count: int


@dataclass(frozen=True)
class DatasetMeta:
    root: Path
    shards: list[Shard]

    @property
    def total_samples(self) -> int:
        return sum(shard.count for shard in self.shards)


@dataclass
class ShardSample:
    """One sample's members, by part name (`jpg`, `txt`, ...)."""

    shard: str
    key: str
    parts: dict[str, bytes] = field(default_factory=dict)

    @property
    def full_key(self) -> str:
        return f"{self.shard}/{self.key}"


# --- writing -----------------------------------------------------------------------------


def conversation(caption: str) -> list[dict[str, str]]:
    return [{"from": "human", "value": f"<image>\n{PROMPT}"}, {"from": "gpt", "value": caption}]


def _add_member(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mode = 0o644
    info.mtime = 0  # byte-identical shards from identical input
    tar.addfile(info, io.BytesIO(payload))


def _write_shard(path: Path, samples: list[CaptionedImage]) -> None:
    offsets: list[int] = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for sample in samples:
            offsets.append(tar.offset)
            _add_member(tar, f"{sample.key}.jpg", sample.jpeg)
            _add_member(tar, f"{sample.key}.txt", sample.caption.encode("utf-8"))
            _add_member(tar, f"{sample.key}.json", json.dumps(conversation(sample.caption)).encode("utf-8"))
        offsets.append(tar.offset)  # Energon's index ends with the offset past the last sample
    with (path.parent / (path.name + ".idx")).open("wb") as index:
        index.write(b"".join(struct.pack("Q", offset) for offset in offsets))


def write_dataset(out_dir: Path, samples: Iterable[CaptionedImage], samples_per_shard: int) -> DatasetMeta:
    """Write shards and .nv-meta into out_dir, atomically: a killed build leaves nothing behind.

    out_dir must not exist yet (or be an empty directory).
    """
    out_dir = out_dir.resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".building", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a dataset is read by other users and jobs
    try:
        batch: list[CaptionedImage] = []
        counts: dict[str, int] = {}
        seen: set[str] = set()

        def flush() -> None:
            name = f"shard_{len(counts):06d}.tar"
            _write_shard(staging / name, batch)
            counts[name] = len(batch)
            batch.clear()

        for sample in samples:
            if sample.key in seen or sample.key != safe_key(sample.key):
                raise ValueError(f"sample key {sample.key!r} is duplicated or unsafe (use safe_key)")
            seen.add(sample.key)
            batch.append(sample)
            if len(batch) == samples_per_shard:
                flush()
        if batch:
            flush()
        if not counts:
            raise ValueError("no samples to write")
        meta = staging / META_DIR
        meta.mkdir()
        names = list(counts)
        _write_yaml(meta / INFO_YAML, {"shard_counts": counts})
        _write_yaml(
            meta / SPLIT_YAML, {"split_parts": {"train": names, "val": [], "test": []}, "exclude": []}
        )
        _write_yaml(meta / DATASET_YAML, DATASET_SPEC)
        _write_yaml(meta / CAPTIONING_YAML, CAPTIONING_SPEC)
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return read_meta(out_dir)


def _write_yaml(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(payload, sort_keys=False))


# --- reading -----------------------------------------------------------------------------

_BUILD_FIX = "Fix: point data.path at a dataset built by scripts/build_dataset.py (or `energon prepare`)."


def _load_yaml_or_json(path: Path) -> Any:
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise DatasetNotFound(f"data.path: cannot parse {path}: {exc}. {_BUILD_FIX}") from exc


def read_meta(root: Path, split: str = "train") -> DatasetMeta:
    """The shards of one split with their sample counts, checked against the files on disk."""
    if not root.is_dir():
        raise DatasetNotFound(f"data.path={root}: no such directory. {_BUILD_FIX}")
    meta = root / META_DIR
    info_path = next((meta / name for name in (INFO_JSON, INFO_YAML) if (meta / name).is_file()), None)
    if info_path is None or not (meta / SPLIT_YAML).is_file():
        raise DatasetNotFound(
            f"data.path={root}: not an Energon-prepared WebDataset (needs {META_DIR}/{INFO_YAML} and "
            f"{META_DIR}/{SPLIT_YAML}). {_BUILD_FIX}"
        )
    info = _load_yaml_or_json(info_path)
    splits = _load_yaml_or_json(meta / SPLIT_YAML)
    counts = info.get("shard_counts") if isinstance(info, dict) else None
    parts = splits.get("split_parts") if isinstance(splits, dict) else None
    if not isinstance(counts, dict) or not isinstance(parts, dict):
        raise DatasetNotFound(
            f"data.path={root}: {info_path.name} or {SPLIT_YAML} lacks shard_counts/split_parts. {_BUILD_FIX}"
        )
    names = parts.get(split) or []
    if not names:
        raise ShardError(
            f"data.path={root}: split {split!r} lists no shards in {META_DIR}/{SPLIT_YAML}. {_BUILD_FIX}"
        )
    shards = []
    for name in names:
        path = root / name
        if name not in counts:
            raise ShardError(
                f"data.path={root}: shard {name} is in {SPLIT_YAML} but not in {info_path.name}. {_BUILD_FIX}"
            )
        if not path.is_file():
            raise ShardError(f"data.path={root}: shard {name} is missing. {_BUILD_FIX}")
        if int(counts[name]) < 1 or path.stat().st_size == 0:
            raise ShardError(
                f"data.path={root}: shard {name} is empty. "
                f"Fix: rebuild the dataset or drop the shard from {SPLIT_YAML}."
            )
        shards.append(Shard(name=name, path=path, count=int(counts[name])))
    return DatasetMeta(root=root, shards=shards)


@dataclass(frozen=True)
class _MemberSpan:
    offset: int
    size: int


@dataclass
class SampleLocation:
    shard: Shard
    key: str
    members: dict[str, _MemberSpan]


def index_shard(shard: Shard) -> list[SampleLocation]:
    """Where each sample's members lie in the shard (reads the tar headers only)."""
    samples: list[SampleLocation] = []
    try:
        with tarfile.open(shard.path, "r:") as tar:
            for member in tar:
                if not member.isfile() or "." not in Path(member.name).name:
                    continue
                base, part = _split_name(member.name)
                if base.startswith("__") or not part:
                    continue  # WebDataset metadata members
                if not samples or samples[-1].key != base:
                    samples.append(SampleLocation(shard=shard, key=base, members={}))
                samples[-1].members[part] = _MemberSpan(member.offset_data, member.size)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ShardError(
            f"shard {shard.path} is corrupt or truncated ({exc}). Fix: rebuild the dataset."
        ) from exc
    if len(samples) != shard.count:
        raise ShardError(
            f"shard {shard.path} holds {len(samples)} samples but {META_DIR} says {shard.count}. "
            "Fix: rebuild the dataset (or re-run `energon prepare`)."
        )
    return samples


def _split_name(name: str) -> tuple[str, str]:
    # Energon's rule: the key is everything before the first dot of the file name.
    directory, _, filename = name.rpartition("/")
    stem, _, part = filename.partition(".")
    return (f"{directory}/{stem}" if directory else stem), part.lower()


def read_sample(location: SampleLocation) -> ShardSample:
    sample = ShardSample(shard=location.shard.name, key=location.key)
    try:
        with location.shard.path.open("rb") as handle:
            for part, span in location.members.items():
                handle.seek(span.offset)
                payload = handle.read(span.size)
                if len(payload) != span.size:
                    raise ShardError(
                        f"shard {location.shard.path} is truncated at sample {location.key}. "
                        "Fix: rebuild the dataset."
                    )
                sample.parts[part] = payload
    except OSError as exc:
        raise ShardError(f"cannot read shard {location.shard.path}: {exc}") from exc
    return sample


def iter_samples(meta: DatasetMeta) -> Iterator[ShardSample]:
    """Every sample of the split, in shard order (what the builder test reads back)."""
    for shard in meta.shards:
        for location in index_shard(shard):
            yield read_sample(location)
