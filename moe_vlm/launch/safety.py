"""What may reach a shell, and what must never be written down.

Config strings end up in sbatch scripts and srun command lines. Values that name things
(a job name, a partition, an image, a mount) are checked against a small alphabet and
rejected with one line naming the key, the bad character and a fix; they are also quoted
when rendered, so a value that slips through is still data, never code.

Secrets live in the environment (tokens, keys, passwords). Their values are masked in
every config, script and record this package writes, and setup lines may not assign one
literally (the job inherits the submitting shell's environment instead).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from moe_vlm.errors import BadInput

# Environment variable names that hold secrets.
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|CREDENTIAL|PRIVATE|(^|_)KEY($|_)|API_?KEY|AUTH", re.I
)
MASK = "***"
# Shorter values are too common ("1", "true") to mask without mangling unrelated text.
MIN_SECRET_LENGTH = 6

NAME_CHARS = r"A-Za-z0-9._:@%+=,/-"  # job names, partitions, accounts, QoS, reservations
IMAGE_CHARS = r"A-Za-z0-9._:@#/+-"  # docker refs (nvcr.io#nvidia/nemo:25.09) and squashfs paths
MOUNT_PART_CHARS = r"A-Za-z0-9._@/+=-"  # one side of SRC:DST[:FLAGS]; commas separate mounts


def check_word(key: str, value: str, chars: str = NAME_CHARS, example: str = "my_partition") -> str:
    """Return value when it only uses `chars`; raise BadInput naming the first bad character."""
    if not value:
        raise BadInput(
            f"{key}: empty value. Fix: set {key} to a name like {example!r} or leave it unset (null)."
        )
    bad = re.search(f"[^{chars}]", value)
    if bad:
        char = bad.group(0)
        raise BadInput(
            f"{key}={value!r}: character {char!r} is not allowed here (allowed: letters, digits and "
            f"{_punctuation(chars)}). Fix: use a plain name like {example!r}."
        )
    return value


def check_mount(key: str, mount: str) -> str:
    parts = mount.split(":")
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise BadInput(
            f"{key}={mount!r}: a mount is SRC[:DST[:FLAGS]]. Fix: write it like '/lustre/data:/data:ro'."
        )
    for part in parts:
        check_word(key, part, MOUNT_PART_CHARS, "/lustre/data:/data:ro")
    return mount


def check_no_control(key: str, value: str) -> str:
    """Free text (setup lines, srun arguments) may be anything printable but no line breaks."""
    bad = re.search(r"[\x00-\x08\x0a-\x1f\x7f]", value)
    if bad:
        raise BadInput(
            f"{key}: contains a control character ({bad.group(0)!r}); one entry is one line. "
            "Fix: split it into separate list entries."
        )
    return value


def check_setup_line(key: str, line: str) -> str:
    check_no_control(key, line)
    for match in re.finditer(r"(?:^|[\s;&|])(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S*)", line):
        name, value = match.group(1), match.group(2)
        if SECRET_NAME.search(name) and value and not value.startswith(("$", '"$')):
            raise BadInput(
                f"{key}: {line.split('=')[0].strip()}=... writes a secret into the job script. "
                f"Fix: drop it and export {name} in the shell you submit from (Slurm passes it to the job)."
            )
    return line


def _punctuation(chars: str) -> str:
    punct = chars.replace("A-Za-z0-9", "").replace("\\", "")
    return " ".join(punct)


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    values = {
        value for name, value in env.items() if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_LENGTH
    }
    return sorted(values, key=len, reverse=True)  # longest first: a value may contain another


def scrub_text(text: str, secrets: Iterable[str] | None = None) -> str:
    for value in secret_values() if secrets is None else secrets:
        text = text.replace(value, MASK)
    return text


def scrub(value: Any, secrets: Iterable[str] | None = None) -> Any:
    """A copy of a JSON-like value with every secret value masked.

    Masking goes by value, not by key name: config keys such as `max_text_tokens` look like
    secrets to a name pattern but hold numbers that records must keep.
    """
    known = list(secret_values() if secrets is None else secrets)
    if isinstance(value, str):
        return scrub_text(value, known)
    if isinstance(value, Mapping):
        return {key: scrub(item, known) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(item, known) for item in value]
    return value


def scrub_files(paths: Iterable[Path]) -> None:
    """Mask secrets in files another component wrote (run.json, Hydra's saved configs)."""
    known = secret_values()
    if not known:
        return
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        clean = scrub_text(text, known)
        if clean != text:
            tmp = path.with_name(f".{path.name}.scrub.tmp")
            tmp.write_text(clean)
            os.replace(tmp, path)
