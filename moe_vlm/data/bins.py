"""First-fit-decreasing: the packer's algorithm (data/packer.py), light enough for the plan.

The memory estimate and the step-time prediction pack drawn sample sizes with the same function the
packer packs samples with (perf/memory/micro_batch.py), so a plan sizes the rows a run will see.
"""

from __future__ import annotations


def padded_length(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each summing to at most `capacity`; longest first, ties in index order."""
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        if length > capacity:
            raise ValueError(f"a sample of {length} tokens cannot fit a row of {capacity}")
        for b, left in enumerate(room):
            if length <= left:
                bins[b].append(index)
                room[b] -= length
                break
        else:
            bins.append([index])
            room.append(capacity - length)
    return bins
