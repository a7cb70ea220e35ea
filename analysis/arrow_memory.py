"""Which allocator Arrow's buffers come from in a process that runs the analysis.

pyarrow's default pool (mimalloc in its Linux wheels) keeps the pages it freed for its own
next buffers. Post-processing alternates between Arrow (the KPI table's columns, its
Parquet conversion) and Python objects (verdict rows, the report's figures), so the ~30 MB
the Parquet conversion freed stayed with Arrow while the later stages took new memory:
10 000 result dirs peaked at 414 MB with it and at 376-388 MB with the system allocator, at
the same speed (`benchmarks/analysis_bounds.py`, docs/performance.md). The C library takes
back what Arrow frees, and the later stages reuse it.

Arrow's C++ code reads its pool from ``ARROW_DEFAULT_MEMORY_POOL`` once, when pyarrow is
imported; ``pyarrow.set_memory_pool`` afterwards reaches only the calls made from Python
(399 MB). So the CLI calls `use_system_allocator` before anything imports pyarrow, and the
history's schema module calls it too (any other process: the Python-side calls at least).
An explicit ``ARROW_DEFAULT_MEMORY_POOL`` always wins, and the variable is never left set
for the processes this one starts (a workload's own pyarrow keeps its default).
"""

from __future__ import annotations

import os
import sys

__all__ = ["POOL_ENV", "use_system_allocator"]

POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_allocator() -> str:
    """Make the C library's allocator Arrow's default pool, unless `POOL_ENV` names one.

    Idempotent; returns the backend in use. Buffers allocated before the call keep their
    pool (Arrow frees each buffer to the pool it came from).
    """
    if os.environ.get(POOL_ENV):
        import pyarrow as pa
    elif "pyarrow" not in sys.modules:
        os.environ[POOL_ENV] = "system"
        try:
            import pyarrow as pa

            pa.default_memory_pool()  # read now, while the variable says so
        finally:
            os.environ.pop(POOL_ENV, None)
    else:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    return str(pa.default_memory_pool().backend_name)
