"""Real data: the builder on scikit-image's photographs, the shard reader, rank sharding, bad input."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from moe_vlm.data import DataStats, build_batches, check_data
from moe_vlm.data.energon import CaptionedImage, iter_samples, read_meta, write_dataset
from moe_vlm.data.errors import DataError, DatasetNotFound, ShardError
from moe_vlm.data.real import rank_locations
from moe_vlm.rules import validate
from tests.conftest import REPO, make_spec

BUILDER = REPO / "scripts" / "build_dataset.py"
PHOTOS = 21  # scripts/build_dataset.py SKIMAGE_CAPTIONS


def run_builder(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BUILDER), *args], capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real") / "skimage_photos"
    result = run_builder("--skimage", str(out))
    assert result.returncode == 0, result.stderr
    assert f"wrote {PHOTOS} samples in 3 shard(s)" in result.stdout
    return out


def real_spec(path: Path, *overrides: str) -> list[str]:
    return ["data=real", f"data.path={path}", *overrides]


def test_builder_output_reads_back(photos: Path) -> None:
    meta = read_meta(photos)
    assert [shard.count for shard in meta.shards] == [8, 8, 5]
    samples = list(iter_samples(meta))
    assert len(samples) == PHOTOS
    by_key = {sample.key: sample for sample in samples}
    assert by_key["chelsea"].parts["txt"].decode().startswith("Close-up of a tabby cat")
    assert set(by_key["astronaut"].parts) == {"jpg", "txt", "json"}
    assert (photos / "shard_000000.tar.idx").stat().st_size == (8 + 1) * 8  # Energon's uint64 offsets


def test_energon_itself_reads_the_shards(photos: Path) -> None:
    energon = pytest.importorskip("megatron.energon")
    worker = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = energon.get_train_dataset(
        str(photos),
        dataset_config="captioning.yaml",
        batch_size=1,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=worker,
    )
    assert len(dataset) == PHOTOS
    sample = next(iter(energon.get_loader(dataset)))
    assert sample.image.shape[1] == 3 and sample.caption[0].endswith(".")


def test_ranks_get_disjoint_slices_covering_the_split(photos: Path) -> None:
    for world in (2, 3, 4):
        slices = [
            [f"{loc.shard.name}/{loc.key}" for loc in rank_locations(photos, r, world)] for r in range(world)
        ]
        keys = [key for part in slices for key in part]
        assert len(keys) == len(set(keys)) == PHOTOS
        assert max(map(len, slices)) - min(map(len, slices)) <= 1


def test_real_batches_count_what_the_photos_give(photos: Path) -> None:
    # Hand-computed (see test_data_accounting): Chelsea 300 x 451 -> 288 x 448, 126 tokens; the retina
    # 1411 x 1411 -> 992 x 992, 961 tokens; the astronaut 512 x 512 stays, 32 x 32 / 4 = 256 tokens.
    expected = {
        "chelsea": ((300, 451), (288, 448)),
        "retina": ((1411, 1411), (992, 992)),
        "astronaut": ((512, 512),) * 2,
    }
    spec = make_spec(*real_spec(photos, "mbs=2"))
    seen: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}
    stats = DataStats()
    for rank in range(2):
        for batch in islice(build_batches(spec, rank=rank, world_size=2), 6):  # 12 samples > 11 per rank
            assert batch.stats.images == batch.stats.samples == 2  # one photo per sample
            for key, original, resized in zip(
                batch.sample_keys, batch.image_original_hw, batch.image_resized_hw, strict=True
            ):
                seen[key.split("/")[-1]] = (original, resized)
            stats.add(batch)
    assert len(seen) == PHOTOS
    for name, sizes in expected.items():
        assert seen[name] == sizes
    record = stats.to_dict()
    assert record["kind"] == "real" and record["skipped_samples"] == 0
    assert record["images_per_sample"]["histogram"] == {"1": 24}


def test_bad_paths_fail_before_running(tmp_path: Path, photos: Path) -> None:
    missing = tmp_path / "nope"
    plain = tmp_path / "plain"
    plain.mkdir()
    for path, match in ((missing, "no such directory"), (plain, "not an Energon-prepared WebDataset")):
        spec = make_spec(*real_spec(path))
        assert "A005" in {f.code for f in validate(spec)}
        with pytest.raises(DatasetNotFound, match=match):
            check_data(spec)
    assert "A005" not in {f.code for f in validate(make_spec(*real_spec(photos)))}
    check_data(make_spec(*real_spec(photos)))


def _copy(photos: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(photos, copy)
    return copy


def test_empty_shard_is_an_error(tmp_path: Path, photos: Path) -> None:
    copy = _copy(photos, tmp_path)
    (copy / "shard_000001.tar").write_bytes(b"")
    with pytest.raises(ShardError, match=r"shard_000001\.tar is empty"):
        check_data(make_spec(*real_spec(copy)))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_shard_is_an_error(tmp_path: Path, photos: Path, damage: str) -> None:
    copy = _copy(photos, tmp_path)
    shard = copy / "shard_000000.tar"
    data = shard.read_bytes()
    shard.write_bytes(b"\x07" * 2048 + data[2048:] if damage == "garbage" else data[: len(data) // 3])
    with pytest.raises(ShardError, match=r"shard_000000\.tar"):
        build_batches(make_spec(*real_spec(copy)), rank=0, world_size=1)


def test_more_ranks_than_samples_is_an_error(tmp_path: Path) -> None:
    tiny = write_dataset(
        tmp_path / "one", [CaptionedImage("only", _photo_jpeg(), "One photo.")], samples_per_shard=8
    )
    with pytest.raises(DataError, match="cannot feed 2 data-parallel ranks"):
        rank_locations(tiny.root, 1, 2)


def _photo_jpeg() -> bytes:
    import io

    import skimage.data
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(skimage.data.coffee()).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_bad_samples_are_skipped_with_their_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = _photo_jpeg()
    samples = [
        CaptionedImage("good", good, "A cup of coffee."),
        CaptionedImage("broken", b"\xff\xd8 not really a jpeg", "A broken image."),
        CaptionedImage("silent", good, ""),
        CaptionedImage("good2", good, "Another cup of coffee."),
    ]
    meta = write_dataset(tmp_path / "bad", samples, samples_per_shard=8)
    spec = make_spec(*real_spec(meta.root, "mbs=2"))
    with caplog.at_level(logging.WARNING):
        batches = list(islice(build_batches(spec, rank=0, world_size=1), 3))  # 3 epochs of 2 good samples
    for batch in batches:
        assert sorted(batch.sample_keys) == ["shard_000000.tar/good", "shard_000000.tar/good2"]
    # Skips are counted in the batch being filled when they are met: at least the first epoch's two.
    assert sum(batch.stats.skipped_samples for batch in batches) >= 2
    assert "shard_000000.tar/broken" in caplog.text and "image does not decode" in caplog.text
    assert "shard_000000.tar/silent" in caplog.text and "no text" in caplog.text
    assert "/good" not in caplog.text


def test_builder_rejects_bad_folders_in_one_line(tmp_path: Path, photos: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "cup.jpg").write_bytes(_photo_jpeg())
    out = tmp_path / "out"
    result = run_builder("--images", str(folder), str(out))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "cup.jpg: no caption (cup.txt missing)" in result.stderr
    assert not out.exists()
    (folder / "cup.txt").write_text("A cup of coffee.")
    (folder / "bad.png").write_bytes(b"not a png")
    (folder / "bad.txt").write_text("Nothing.")
    result = run_builder("--images", str(folder), str(out))
    assert result.returncode == 2 and "bad.png: image does not decode" in result.stderr
    (folder / "bad.png").unlink()
    assert run_builder("--images", str(folder), str(out)).returncode == 0
    assert [s.count for s in read_meta(out).shards] == [1]
    result = run_builder("--skimage", str(out))
    assert result.returncode == 2 and "exists and is not empty" in result.stderr
    assert [s.count for s in read_meta(out).shards] == [1]  # untouched
