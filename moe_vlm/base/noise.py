"""Library messages a CPU run cannot act on, kept off the console.

- torch.utils.cpp_extension logs a WARNING when it is imported on a machine with a CUDA toolkit
  but no GPU: `No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'`
  (torch/utils/cpp_extension.py:182-183, `_find_cuda_home`). Transformer Engine and Megatron
  import it, so every CPU run that imports them printed it. That one message is dropped, on that
  logger only; every other record of it passes.
- Kineto, when the torch profiler starts on CPU, prints `gpuGetDeviceCount failed with code 35`
  (ERROR) and `profiler_start` / `profiler_stop` (USDT) to stderr from C++. Its levels
  (torch/include/kineto/ILoggerObserver.h): VERBOSE=0 ... ERROR=4, USDT=5, ENUM_COUNT=6; it reads
  KINETO_LOG_LEVEL when the profiler starts, so `quiet_kineto` sets it (CPU ranks only: on GPUs
  its errors are kept); a level the user exported wins.
- A dry run's library checks import Megatron, Bridge, Transformer Engine and transformers, which
  print Python warnings (Apex missing, deprecations), log lines (through Hydra's root handler) and
  C-level messages: about 18 lines that buried the plan. `captured` takes them at the file
  descriptors (the only place every one of them passes), so the plan keeps them in plan.json;
  our own progress lines go to `progress()`, the console saved before the capture.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import TextIO

CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"
NO_CUDA_RUNTIME = "No CUDA runtime is found"
KINETO_QUIET = "6"  # ENUM_COUNT: above every Kineto level


class _NoCudaRuntime(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NO_CUDA_RUNTIME)


def install() -> None:
    """Filter the cpp_extension warning; before torch.utils.cpp_extension is imported (it logs
    at import), so moe_vlm/__init__.py calls it. Idempotent."""
    logger = logging.getLogger(CPP_EXTENSION_LOGGER)
    if not any(isinstance(f, _NoCudaRuntime) for f in logger.filters):
        logger.addFilter(_NoCudaRuntime())


def quiet_kineto() -> None:
    """Before the torch profiler starts on a CPU rank."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)


_console: list[TextIO] = []  # the saved stderr while `captured` holds the descriptors


def progress() -> TextIO:
    """Where a progress line goes: the console, even while `captured` holds stdout and stderr."""
    return _console[-1] if _console else sys.stderr


@contextlib.contextmanager
def captured(enabled: bool = True) -> Iterator[list[str]]:
    """Everything written to stdout and stderr inside (Python, logging, C), as lines in the list
    yielded, filled when the block ends; the console gets nothing. If the block raises, the
    captured text goes to stderr first, so the reason for the failure is not lost.
    enabled=False captures nothing (the list stays empty)."""
    lines: list[str] = []
    if not enabled:
        yield lines
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    console = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    failed = False
    with tempfile.TemporaryFile(mode="w+b") as sink:
        for fd in saved:
            os.dup2(sink.fileno(), fd)
        _console.append(console)
        try:
            yield lines
        except BaseException:
            failed = True
            raise
        finally:
            _console.pop()
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            console.close()
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            lines += [line for line in text.splitlines() if line.strip()]
            if failed:
                sys.stderr.write(text)
                sys.stderr.flush()
