#!/usr/bin/env python
"""Build an image-text dataset in the layout Megatron Energon reads (WebDataset shards + .nv-meta/).

    # real photographs that scikit-image ships (no download), with hand-written captions
    python scripts/build_dataset.py --skimage build/skimage_photos

    # your own folder: every image (jpg, jpeg, png, webp, bmp, tif) with a caption file
    # of the same name beside it (cat.jpg + cat.txt)
    python scripts/build_dataset.py --images DIR OUT_DIR

    python train.py data=real data.path=build/skimage_photos

The output directory is written atomically (built beside it, then renamed): a killed build
leaves nothing behind. Bad input (no caption, an empty caption, an image that does not
decode, an existing non-empty OUT_DIR) stops with one line and exit status 2.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from moe_vlm.data.energon import CaptionedImage, DatasetMeta, read_meta, safe_key, write_dataset

EXIT_BAD_INPUT = 2
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
JPEG_QUALITY = 95

# scikit-image's bundled photographs (in the wheel, loaded offline) and what each one shows.
SKIMAGE_CAPTIONS: dict[str, str] = {
    "astronaut": "A portrait of an astronaut in an orange flight suit holding a helmet, a flag behind her.",
    "coffee": "An espresso in a red cup on a red saucer with a small spoon, on a wooden table.",
    "chelsea": "Close-up of a tabby cat with green eyes and long white whiskers.",
    "rocket": "A rocket on its launch pad at dusk, lit by floodlights between tall lightning towers.",
    "hubble_deep_field": "The Hubble deep field: hundreds of small distant galaxies on a black sky.",
    "retina": "A colour photograph of the back of a human eye: the retina, its optic disc and blood vessels.",
    "immunohistochemistry": "A microscope slide: brown-stained cell clusters among blue-stained tissue.",
    "stereo_motorcycle": "A red motorcycle parked in a garage in front of shelves with boxes.",
    "logo": "The scikit-image logo: a snake drawn over the green and orange halves of a circle.",
    "camera": "A man in a dark coat looks through a camera on a tripod in an open field.",
    "moon": "The cratered surface of the moon in grey tones.",
    "coins": "Rows of old coins on a dark background.",
    "clock": "A wall clock blurred by motion against a grey background.",
    "page": "A scanned book page about region-based segmentation, ending in a line of Python code.",
    "text": "Handwritten equations on a sheet of paper, photographed at an angle.",
    "brick": "A brick wall in close-up, in grey tones.",
    "grass": "Blades of grass in close-up, in grey tones.",
    "gravel": "Gravel stones in close-up, in grey tones.",
    "horse": "The black silhouette of a horse on a white background.",
    "cell": "A microscope image of a single bright round cell on a grey background.",
    "microaneurysms": "A small grey patch of retina crossed by thin dark blood vessels.",
}


class BadInput(Exception):
    """One line for the user; exit status 2."""


def _jpeg(image: Image.Image) -> bytes:
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")  # JPEG has no alpha; RGBA, palette and 1-bit images become RGB
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def skimage_samples() -> Iterator[CaptionedImage]:
    import skimage.data

    for name, caption in SKIMAGE_CAPTIONS.items():
        pixels = getattr(skimage.data, name)()
        if name == "stereo_motorcycle":
            pixels = pixels[0]  # the left view of the stereo pair
        if pixels.dtype == bool:
            pixels = pixels.astype(np.uint8) * 255
        yield CaptionedImage(key=safe_key(name), jpeg=_jpeg(Image.fromarray(pixels)), caption=caption)


def folder_samples(folder: Path) -> Iterator[CaptionedImage]:
    if not folder.is_dir():
        raise BadInput(
            f"--images {folder}: no such directory. Fix: give a folder of images with .txt captions."
        )
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise BadInput(f"--images {folder}: no images ({', '.join(IMAGE_SUFFIXES)}). Fix: check the folder.")
    keys: dict[str, Path] = {}
    for path in images:
        caption_file = path.with_suffix(".txt")
        if not caption_file.is_file():
            raise BadInput(
                f"{path}: no caption ({caption_file.name} missing). Fix: add it, or remove the image."
            )
        caption = caption_file.read_text(encoding="utf-8", errors="strict").strip()
        if not caption:
            raise BadInput(f"{caption_file}: empty caption. Fix: write the caption, or remove the image.")
        key = safe_key(path.stem)
        if key in keys:
            raise BadInput(f"{path} and {keys[key]} map to the same sample key {key!r}. Fix: rename one.")
        keys[key] = path
        try:
            with Image.open(path) as image:
                image.load()
                payload = path.read_bytes() if image.format == "JPEG" else _jpeg(image)
        except (OSError, ValueError) as exc:
            raise BadInput(f"{path}: image does not decode ({exc}). Fix: replace or remove it.") from exc
        yield CaptionedImage(key=key, jpeg=payload, caption=caption)


def build(
    out_dir: Path, samples: Iterator[CaptionedImage], samples_per_shard: int, overwrite: bool
) -> DatasetMeta:
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"{out_dir} exists and is not a directory. Fix: choose another OUT_DIR.")
    replace = out_dir.is_dir() and any(out_dir.iterdir())
    if replace and not overwrite:
        raise BadInput(f"{out_dir} exists and is not empty. Fix: choose another OUT_DIR or pass --overwrite.")
    collected = list(samples)  # every input is checked before anything is written
    if not replace:
        return write_dataset(out_dir, collected, samples_per_shard)
    # The old dataset is swapped out only once the new one is complete.
    staged, previous = out_dir.with_name(f".{out_dir.name}.new"), out_dir.with_name(f".{out_dir.name}.old")
    for leftover in (staged, previous):
        shutil.rmtree(leftover, ignore_errors=True)
    write_dataset(staged, collected, samples_per_shard)
    out_dir.rename(previous)
    staged.rename(out_dir)
    shutil.rmtree(previous)
    return read_meta(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--skimage", action="store_true", help="scikit-image's bundled photographs")
    source.add_argument("--images", type=Path, metavar="DIR", help="a folder of images with .txt captions")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    parser.add_argument("--samples-per-shard", type=int, default=8)
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    try:
        if args.samples_per_shard < 1:
            raise BadInput(f"--samples-per-shard={args.samples_per_shard} must be >= 1. Fix: e.g. 8.")
        samples = skimage_samples() if args.skimage else folder_samples(args.images)
        meta = build(args.out_dir, samples, args.samples_per_shard, args.overwrite)
    except BadInput as exc:
        print(f"build_dataset: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(
        f"wrote {meta.total_samples} samples in {len(meta.shards)} shard(s) to {meta.root}\n"
        f"train on it: python train.py data=real data.path={meta.root}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
