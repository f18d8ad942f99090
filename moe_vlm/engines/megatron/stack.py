"""The Megatron stack this engine runs on: what imports here, at which version."""

from __future__ import annotations

import importlib
import importlib.metadata

PINNED = {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2"}
INSTALL_HINT = (
    "install the pinned stack with `bash scripts/install_megatron.sh` (CPU machines) or run inside "
    "NVIDIA's NeMo container (see docs/megatron.md, 'Cluster install')"
)


def stack_problem() -> str | None:
    """Why the Megatron stack cannot be used here (None when it can)."""
    try:
        import megatron.bridge
        import megatron.core  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # ImportError, or TE's FileNotFoundError for a missing torch extension
        return f"the Megatron stack does not import ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
    for package, wanted in PINNED.items():
        installed = importlib.metadata.version(package)
        if installed != wanted:
            return (
                f"{package} {installed} is installed, the engine is checked against {wanted}; {INSTALL_HINT}"
            )
    return None


def versions() -> dict[str, str | None]:
    names = ("megatron-core", "megatron-bridge", "transformer-engine", "transformer-engine-torch")
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found
