"""The distributions installed on the import path, read from their metadata directories' names.

`<name>-<version>.dist-info` (and `.egg-info`) is how pip names them and how importlib.metadata
resolves them: one listing per path entry answers every question here, where
importlib.metadata.version() imports the email package and parses a METADATA file per call (a
tenth of a CPU dry run's own start-up, issue 33).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import NamedTuple


class MetadataDir(NamedTuple):
    entry: str  # the sys.path entry holding it
    item: str  # the directory's name
    name: str  # the distribution's normalised name (PEP 503: megatron-core)
    version: str  # '' for an egg-info without one


def metadata_dirs() -> Iterator[MetadataDir]:
    """Every metadata directory on sys.path, in import-path order (the first of a name wins)."""
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for item in names:
            stem, dot, suffix = item.rpartition(".")
            if suffix not in ("dist-info", "egg-info") or not dot:
                continue
            distribution, _, version = stem.partition("-")
            yield MetadataDir(
                entry, item, re.sub(r"[-_.]+", "-", distribution).lower(), version.split("-py")[0]
            )


def versions_of(found: Iterable[MetadataDir]) -> dict[str, str]:
    """Each distribution's version by its normalised name, the first on the import path winning."""
    versions: dict[str, str] = {}
    for one in found:
        versions.setdefault(one.name, one.version)
    return versions


@functools.cache
def installed_versions() -> dict[str, str]:
    """Each installed distribution's version by its normalised name."""
    return versions_of(metadata_dirs())
