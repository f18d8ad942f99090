"""Site settings: the values that differ per cluster account, never per experiment.

Account, partition, QoS, container image, mounts and setup lines are the user's, so the
launcher presets leave them empty and they come, in order of precedence, from:

1. the launcher config (`hydra.launcher.account=...` on the command line),
2. environment variables `MOE_VLM_ACCOUNT`, `MOE_VLM_PARTITION`, `MOE_VLM_QOS`,
   `MOE_VLM_RESERVATION`, `MOE_VLM_CONTAINER_IMAGE`, `MOE_VLM_CONTAINER_MOUNTS`
   (comma separated), `MOE_VLM_PYTHON`,
3. the site file `$MOE_VLM_SITE_FILE` or `~/.config/moe_vlm/site.yaml`: top-level keys
   apply to every cluster, a section named after the cluster (`gb200:`, `b200:`) overrides
   them for that cluster:

       account: my_account
       container_mounts: [/lustre:/lustre]
       gb200:
         partition: gb200
         container_image: nvcr.io#nvidia/nemo:25.09
       b200:
         partition: batch_b200

Two top-level keys say where a bare `python train.py ...` goes (moe_vlm/launch/entry.py):
`cluster` (the default for `cluster=`) and `launcher` (the `hydra/launcher` that submits the
run from a login node), or `MOE_VLM_CLUSTER` / `MOE_VLM_LAUNCHER`; the command line wins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from moe_vlm.base.errors import BadInput
from moe_vlm.base.inputs import ENV_PATHS, NO_FILE, SITE_FILE_ENV, env_path
from moe_vlm.base.safety import check_credentials

SITE_KEYS = (
    "account",
    "partition",
    "qos",
    "reservation",
    "container_image",
    "container_mounts",
    "container_workdir",
    "container_env",
    "setup",
    "python",
)
LIST_KEYS = {"container_mounts", "container_env", "setup"}
# Top-level only: where a bare command runs (not launcher settings).
ENTRY_KEYS = ("cluster", "launcher")


def site_file() -> Path:
    # Named in the environment: it must exist (a typo would silently drop every site value).
    if os.environ.get(SITE_FILE_ENV) == NO_FILE:
        return Path(os.devnull)
    explicit = env_path(SITE_FILE_ENV, ENV_PATHS[SITE_FILE_ENV])
    if explicit is not None:
        return explicit
    return Path(os.environ.get("XDG_CONFIG_HOME", "~/.config")).expanduser() / "moe_vlm" / "site.yaml"


def _read(path: Path) -> dict[str, Any]:
    if path == Path(os.devnull) or not path.exists():
        return {}
    if not path.is_file():
        raise BadInput(f"{path}: the site file is a directory. Fix: move it away, or set {SITE_FILE_ENV}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: the site file cannot be read ({exc}). Fix: check its permissions") from None
    except yaml.YAMLError as exc:
        raise BadInput(
            f"{path}: not valid YAML ({str(exc).splitlines()[0]}). Fix: correct the site file."
        ) from exc
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: expected a mapping of site keys. Fix: see `moe_vlm/launch/site.py`.")
    # Site values reach job scripts; a credential anywhere in the file stops every command that reads it.
    check_credentials(raw, where=f" in the site file {path}")
    return raw


def load_site_file(path: Path, cluster: str) -> dict[str, Any]:
    raw = _read(path)
    section = raw.get(cluster) or {}
    values = {k: v for k, v in raw.items() if not isinstance(v, dict) and k not in ENTRY_KEYS}
    values |= dict(section)
    unknown = sorted(set(values) - set(SITE_KEYS))
    if unknown:
        raise BadInput(
            f"{path}: unknown key(s) {unknown}. Allowed: {', '.join(SITE_KEYS)} (and at the top level "
            f"{', '.join(ENTRY_KEYS)}). Fix: correct the spelling."
        )
    return values


def entry_defaults() -> dict[str, str]:
    """`cluster` and `launcher` for a bare command: MOE_VLM_CLUSTER / MOE_VLM_LAUNCHER, then the
    site file's top level. Absent keys are left out."""
    path = site_file()
    raw = _read(path)
    found: dict[str, str] = {}
    for key in ENTRY_KEYS:
        value = os.environ.get(f"MOE_VLM_{key.upper()}") or raw.get(key)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise BadInput(f"{path}: {key}: expected a name, got {value!r}. Fix: e.g. {key}: gb200.")
        found[key] = value
    return found


def from_environment() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in SITE_KEYS:
        raw = os.environ.get(f"MOE_VLM_{key.upper()}")
        if raw is None or raw == "":
            continue
        values[key] = [item for item in raw.split(",") if item] if key in LIST_KEYS else raw
    return values


def resolve(explicit: dict[str, Any], cluster: str) -> dict[str, Any]:
    """Site values for `cluster`: explicit launcher values win, then env, then the site file."""
    merged = load_site_file(site_file(), cluster) | from_environment()
    for key, value in explicit.items():
        if value not in (None, [], ""):
            merged[key] = value
    return merged
