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
"""

from __future__ import annotations

import logging
import os

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
