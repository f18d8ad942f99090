"""Run a command as if Transformer Engine were half-installed: its Python package present, its torch
extension (transformer_engine_torch*.so) missing, as an interrupted or failed `pip install` leaves it.

    python tests/megatron/te_half_installed.py train.py <overrides>

TE looks for the extension's file in its own directory and in site-packages
(transformer_engine/common/__init__.py:_get_shared_object_file, via _find_shared_object_in_te_dir)
and raises its own FileNotFoundError when neither holds it (:154). Here that search is made to find
no torch extension, before TE's package runs; everything else (TE's import-time handling, its
FileNotFoundError, our plan) is the real code. The shared venv is left as it is, and the plan cache
is a fresh one.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import tempfile
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from moe_vlm.base.inputs import CACHE_DIR_ENV

TARGET = "transformer_engine.common"
EXTENSION_PREFIX = "transformer_engine_torch"


class _NoTorchExtension(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run_module = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            search = module._find_shared_object_in_te_dir

            def without_torch_extension(te_path: Any, prefix: str) -> Any:
                return None if prefix == EXTENSION_PREFIX else search(te_path, prefix)

            module._find_shared_object_in_te_dir = without_torch_extension  # type: ignore[attr-defined]

        loader.exec_module = exec_module
        return spec


def main() -> None:
    # The plan cache keys an entry by the install's metadata, which this simulation leaves as it is:
    # its verdicts (TE does not import) must not land where a whole install would read them.
    os.environ[CACHE_DIR_ENV] = tempfile.mkdtemp(prefix="moe_vlm_te_half_")
    sys.meta_path.insert(0, _NoTorchExtension())
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
