"""A real dataset's sample lengths against seq_length, read before the queue (rule A014).

Every sample of the train split is encoded as a run encodes it (data/real.py decode, then
data/sequence.py SampleEncoder: the Qwen3-VL image processor's token count, the byte tokenizer),
and counted: how many are longer than seq_length, how many of those lose text to fit (the
policy: text is cut, image tokens never, data/sequence.py), how many cannot fit at all (their
images alone fill seq_length: skipped, never cut). Up to SCAN_LIMIT samples, in shard order;
past it the counts are of the first SCAN_LIMIT and say so. Cached per process by the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moe_vlm.config.schema import DataConfig, ModelConfig

SCAN_LIMIT = 5000


@dataclass(frozen=True)
class Lengths:
    samples: int  # scanned
    total: int  # in the train split
    over: int  # longer than seq_length once encoded (text cut, or skipped)
    skipped: int  # of those, the images alone do not fit: dropped and counted
    longest: int  # the longest encoded length, before any cut

    @property
    def scanned_all(self) -> bool:
        return self.samples == self.total

    def text(self, seq_length: int) -> str:
        scope = "" if self.scanned_all else f" (the first {self.samples:,} of {self.total:,} scanned)"
        return (
            f"{self.over:,} of {self.samples:,} samples{scope} are longer than seq_length={seq_length} "
            f"(longest {self.longest:,} tokens): {self.over - self.skipped:,} lose text to fit, "
            f"{self.skipped:,} cannot fit (their images alone need more) and are skipped"
        )


def _shards_stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.glob("*.tar")))


_CACHE: dict[tuple[object, ...], Lengths] = {}


def dataset_lengths(model: ModelConfig, data: DataConfig, seq_length: int) -> Lengths:
    """The counts for data.path (raises DataError when it cannot be read); cached by the model, the
    pixel bounds, seq_length and the shards' names, sizes and modification times."""
    from moe_vlm.data import sample_encoder
    from moe_vlm.data.energon import read_sample
    from moe_vlm.data.real import decode, rank_locations
    from moe_vlm.data.sequence import SkippedSample

    path = Path(str(data.path)).expanduser()
    key = (repr(model), data.min_pixels, data.max_pixels, str(path), seq_length, _shards_stamp(path))
    if key in _CACHE:
        return _CACHE[key]
    encoder = sample_encoder(model, data, seq_length)
    locations = rank_locations(path, 0, 1)
    over = skipped = longest = scanned = 0
    for location in locations[:SCAN_LIMIT]:
        scanned += 1
        raw = decode(read_sample(location), encoder.tokenizer)
        if isinstance(raw, SkippedSample):
            continue  # unreadable: the run's skip counter says it, it has no length
        encoded = encoder.encode(raw)
        if isinstance(encoded, SkippedSample):
            if encoded.too_long:  # its images leave no room for text: dropped, never cut
                over, skipped = over + 1, skipped + 1
                longest = max(longest, seq_length + 1)
            continue
        length = int(encoded.input_ids.numel()) + encoded.truncated_text_tokens
        longest = max(longest, length)
        over += encoded.truncated_text_tokens > 0
    found = Lengths(scanned, len(locations), over, skipped, longest)
    _CACHE[key] = found
    return found
