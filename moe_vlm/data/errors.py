"""Data errors: what the run flow reports as one line with exit status 2.

A DataError stops the run before (or instead of) producing a wrong batch. Single bad
samples are not errors: the sources skip them with a counted warning naming the sample key
(see moe_vlm.data.sequence.SkippedSample).
"""

from __future__ import annotations


class DataError(Exception):
    """The data cannot be read as configured. The message is one line: what, where, and a fix."""


class DatasetNotFound(DataError):
    """data.path does not exist or is not an Energon-prepared WebDataset."""


class ShardError(DataError):
    """A shard is missing, empty, corrupt, or disagrees with .nv-meta/.info.yaml."""


class NoUsableSamples(DataError):
    """Every sample was skipped (undecodable, without text, or too long for seq_length)."""


class TokenizerMismatch(DataError):
    """The model's special token ids collide with the byte-level text ids."""
