"""What may reach a shell, and what must never be written down.

Config strings end up in sbatch scripts and srun command lines. Values that name things
(a job name, a partition, an image, a mount) are checked against a small alphabet and
rejected with one line naming the key, the bad character and a fix; they are also quoted
when rendered, so a value that slips through is still data, never code.

Secrets live in the environment (tokens, keys, passwords), never in a config value.
A credential typed into a config value is refused before anything is written (`check_credentials`,
called by pre-flight, the site file reader and the launcher): Hydra saves every override in
`.hydra/` and the run keeps its config in run.json, so refusing later would be too late. What
counts as a credential, precisely:

- URL user-info with a password (`scheme://user:password@host`, also `scheme://:token@host`)
  anywhere in a string, and any user-info in an http(s) URL (a token is often the user name);
  `ssh://git@host` and an image digest (`nemo:25.09@sha256:...`) are not credentials;
- a non-empty string under a key that names one: one of the key's words is password, passwd,
  passphrase, secret(s) or credential(s), or its last word is token, key or apikey
  (`hf_token`, `WANDB_API_KEY`, `apiKey`), at any level of the key's path; so `token_dispatcher`,
  `max_text_tokens`, `key_column` and `linear_num_key_heads` are not. A reference to the
  environment (`$HF_TOKEN`, `${HF_TOKEN}`, `${oc.env:HF_TOKEN}`) is not a credential;
- `NAME=value` inside a string (a setup line, an srun argument) where NAME names one, as above,
  and is not a bare `KEY` or `TOKEN` (prose such as `KEY=VALUE`): `HF_TOKEN=`, `PASSWORD=`;
- a URL query parameter that names one, as a key does (`?token=`, `&access_token=`, `?api_key=`,
  `?password=`, `?sig=`), with a literal value;
- a header that carries one (`Authorization: Bearer ...`, `X-API-Key: ...`, `Cookie: ...`).

A query-string secret is refused like user-info, not masked: Hydra writes the override as typed to
`.hydra/overrides.yaml` and `config.yaml` before our task runs, so the only way to keep it out of
them is to refuse it in pre-flight (`moe_vlm/config/preflight.py`), before Hydra starts.

Secrets the config reads from the environment (`${oc.env:...}`) are masked in every config, script
and record this package writes (`scrub`): by value for variables whose name says secret, and by
pattern (user-info, query parameters and headers above) whatever the variable's name, since
`${oc.env:MLFLOW_TRACKING_URI}` may carry `?token=` in a variable named like no secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import write_atomic

# Environment variable names whose values are masked; broad on purpose (masking a harmless value
# costs nothing). Refusing a config value goes by the narrower `credential_name`.
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
    found = _in_string(key, line)
    if found is not None:
        raise BadInput(found.message())
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
    """Every secret masked: the environment's secret values, then any credential by pattern."""
    for value in secret_values() if secrets is None else secrets:
        text = text.replace(value, MASK)
    return mask_patterns(text)


def mask_patterns(text: str) -> str:
    """Mask what the module docstring calls a credential in a string, keeping the rest readable:
    a URL's password or http(s) user name, a credential query parameter's value, a credential
    header's value."""
    text = _URL_PASSWORD_PART.sub(rf"\g<1>{MASK}@", text)
    text = _HTTP_USER_PART.sub(rf"\g<1>{MASK}@", text)
    text = _QUERY.sub(lambda m: f"{m.group(1)}{m.group(2)}={MASK}" if _query_secret(m) else m.group(0), text)
    return _HEADER.sub(_masked_header, text)


def _masked_header(match: re.Match[str]) -> str:
    if not _header_secret(match):
        return match.group(0)
    scheme = _AUTH_SCHEME.match(match.group(3))
    return f"{match.group(1)}{match.group(2)}{scheme.group(0) if scheme else ''}{MASK}"


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
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        clean = scrub_text(text, known)
        if clean != text:
            write_atomic(path, clean)


# --- credentials in config values: refused before anything is written ----------------------------

# scheme://user:password@ (either part may be empty except the password), anywhere in a string.
URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:[^\s/@]+@")
# http(s)://user@: over HTTP the user name alone is often the token (https://<token>@host).
HTTP_USER = re.compile(r"https?://[^\s/@:]+@", re.I)
# The same two, split where the mask goes: (scheme://user:)password@ and (http(s)://)user@.
_URL_PASSWORD_PART = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:)[^\s/@]+@")
_HTTP_USER_PART = re.compile(r"(https?://)[^\s/@:*]+@", re.I)
# ?name=value or &name=value (also ; as a separator): the credential_name test picks the names.
_QUERY = re.compile(r"([?&;])([A-Za-z][A-Za-z0-9_.-]*)=([^&#;\s'\"]*)")
# Query names that carry a credential although credential_name does not say so (signed URLs).
_QUERY_NAMES = frozenset({"sig", "signature", "x-amz-signature"})
# A header whose value is a credential, in a string (a curl -H argument, a header dict's text).
_HEADER = re.compile(
    r"((?:proxy-)?authorization|x-api-key|api-key|x-auth-token|x-access-token|cookie)(['\"]?\s*:\s*['\"]?)"
    r"([^'\"\n]*)",
    re.I,
)
# An authorization scheme before the credential itself (`Bearer <token>`), kept when masking.
_AUTH_SCHEME = re.compile(r"(?i)(bearer|basic|token|digest)\s+")
_CREDENTIAL_WORDS = frozenset(
    {"password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials"}
)
_CREDENTIAL_LAST_WORDS = frozenset({"token", "key", "apikey"})
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# A value that only refers to the environment: the secret stays there.
_REFERENCE = re.compile(r"""["']?\$(\{(oc\.env:)?[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)["']?""")
# NAME=value inside a string: at its start or after a separator (`export HF_TOKEN=...`, `--export=ALL,HF_TOKEN=...`).
_ASSIGNMENT = re.compile(r"""(?:^|(?<=[\s;&|,(]))(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S*)""")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def credential_name(name: str) -> bool:
    """Whether a key (one segment, any case) names a credential: see the module docstring."""
    words = [w.lower() for w in _WORDS.findall(name)]
    return bool(words) and (words[-1] in _CREDENTIAL_LAST_WORDS or not _CREDENTIAL_WORDS.isdisjoint(words))


def _credential_path(key: str) -> bool:
    return any(credential_name(part) for part in re.split(r"[./\[\]]+", key) if part)


def _literal(value: str) -> bool:
    """A value that would write a secret: not empty, not null, not a reference to the environment."""
    text = value.strip()
    return text not in ("", "null", "None", "~", "???", "''", '""') and not _REFERENCE.fullmatch(text)


def credential_env(key: str) -> str:
    """The environment variable(s) that carry this key's credential instead."""
    last = re.split(r"[./\[\]]+", key.strip(".[]"))[-1]
    if _ENV_NAME.fullmatch(last) and credential_name(last):
        return last
    lowered = key.lower()
    if "tracking_uri" in lowered or "mlflow" in lowered:
        return "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
    if "wandb" in lowered:
        return "WANDB_API_KEY"
    if lowered.startswith("logger."):
        return "WANDB_API_KEY (logger=wandb) or MLFLOW_TRACKING_TOKEN (logger=mlflow)"
    if "container_image" in lowered:
        return "none: a registry login goes in enroot's credentials file, $ENROOT_CONFIG_PATH/.credentials"
    return "HF_TOKEN, WANDB_API_KEY or MLFLOW_TRACKING_PASSWORD (whichever the tool reads)"


@dataclass(frozen=True)
class Credential:
    """A credential found in a config value: where, and what kind (never its value)."""

    key: str
    what: str  # "a password in a URL", "a literal credential", "NAME=<literal>"
    env: str  # the environment variable(s) to use instead
    where: str = ""  # " in the site file /path" when not the command line / config

    def message(self) -> str:
        if self.env.startswith("none: "):
            fix = f"drop it; {self.env.removeprefix('none: ')}"
        else:
            fix = f"drop it and export {self.env} in the shell you run from (jobs inherit it)"
        return (
            f"{self.key}{self.where}: holds {self.what}, which would be written to .hydra/, run.json "
            f"and job scripts; nothing was written. Fix: {fix}."
        )


def _assignment(key: str, text: str) -> Credential | None:
    for match in _ASSIGNMENT.finditer(text):
        name, value = match.group(1), match.group(2)
        # A bare `KEY=VALUE` or `TOKEN=...` in free text is prose (help text, a placeholder).
        words = [w.lower() for w in _WORDS.findall(name)]
        named = len(words) > 1 or not _CREDENTIAL_WORDS.isdisjoint(words)
        if named and credential_name(name) and _literal(value):
            return Credential(key, f"{name}=<literal>", name)
    return None


def _query_secret(match: re.Match[str]) -> bool:
    name = match.group(2)
    return (credential_name(name) or name.lower() in _QUERY_NAMES) and _literal(match.group(3))


def _header_secret(match: re.Match[str]) -> bool:
    value = match.group(3).strip()
    scheme = _AUTH_SCHEME.match(value)
    # The credential is the first word after the scheme (`Bearer $T https://h`: $T, a reference).
    words = (value[scheme.end() :] if scheme else value).split()
    return bool(words) and _literal(words[0])


def _in_string(key: str, text: str) -> Credential | None:
    if URL_PASSWORD.search(text) or HTTP_USER.search(text):
        return Credential(key, "a password or token in a URL (user-info user:password@)", credential_env(key))
    query = next((m for m in _QUERY.finditer(text) if _query_secret(m)), None)
    if query is not None:
        return Credential(
            key, f"a credential in a URL's query string ({query.group(2)}=)", credential_env(key)
        )
    header = next((m for m in _HEADER.finditer(text) if _header_secret(m)), None)
    if header is not None:
        return Credential(key, f"a credential in a header ({header.group(1)}:)", credential_env(key))
    return _assignment(key, text)


def _walk(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for name, item in value.items():
            yield from _walk(f"{key}.{name}" if key else str(name), item)
    elif isinstance(value, list | tuple):
        for number, item in enumerate(value):
            yield from _walk(f"{key}[{number}]", item)
    else:
        yield key, value


def find_credential(value: Any, key: str = "") -> Credential | None:
    """The first credential in a JSON-like value (dicts, lists, strings) under `key`, or None."""
    for path, leaf in _walk(key, value):
        if not isinstance(leaf, str):
            continue
        if _credential_path(path) and _literal(leaf):
            return Credential(path, "a literal credential", credential_env(path))
        found = _in_string(path, leaf)
        if found is not None:
            return found
    return None


def check_credentials(value: Any, key: str = "", where: str = "") -> None:
    """Raise BadInput naming the key (never the value) when `value` holds a credential."""
    found = find_credential(value, key)
    if found is not None:
        raise BadInput(Credential(found.key, found.what, found.env, where).message())


def check_override_text(override: str) -> None:
    """A command-line override, as typed, before anything parses or echoes it."""
    key, _, value = override.partition("=")
    key = key.lstrip("+~").split("@", 1)[0]
    if _credential_path(key) and _literal(value):
        raise BadInput(Credential(key, "a literal credential", credential_env(key)).message())
    found = _in_string(key, value)
    if found is not None:
        raise BadInput(found.message())
