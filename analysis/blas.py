"""numpy's BLAS on one thread, in every process that runs the detector.

Importing this module sets it: every module of ``analysis`` that does linear algebra imports
it (a test audits that).

The detector's linear algebra is small (QR and least squares of at most a few thousand runs
by tens of columns: a spline basis, step columns, a season's sines). numpy's bundled
OpenBLAS starts one thread a core for each such call, and its threads wait for each other by
spinning: on a busy machine (the suite's four workers on two cores, a post-processing
beside a workload, the families benchmark's two processes) one call waits on a thread the
scheduler put off. Measured on a 2-core machine (`benchmarks/regression/blas_threads.py`:
a smooth 816-run monthly series beside two processes doing numpy's linear algebra): 0.93-1.25
s to segment with OpenBLAS's two threads, 0.21-0.52 s with one; quiet, the same 0.21 s. TCPD's
816-run US population series beside the families benchmark's two processes: 21.5 s against
0.56 s.

Only the BLAS that numpy itself loaded is limited (its wheel's ``numpy.libs``), so a torch or
another library in the same process keeps its own threads. Where numpy links a BLAS of its
own installation (a distribution's, MKL), nothing is changed.

threadpoolctl's import sets ``KMP_DUPLICATE_LIB_OK`` in the environment (for its own nested
OpenMP libraries); that is undone here: every workload, server and warm Python a run starts
inherits the environment, and a warm Python's key is a digest of it — a run that imported
this between two asks started a second warm Python for the same workload.
"""

from __future__ import annotations

import os

__all__ = ["numpy_blas_threads", "one_blas_thread"]


_KMP = "KMP_DUPLICATE_LIB_OK"


def one_blas_thread() -> None:
    """Limit numpy's bundled BLAS to one thread (run once, when this module is imported)."""
    for controller in _numpy_blas():
        controller.set_num_threads(1)


def numpy_blas_threads() -> list[int]:
    """The thread count of each BLAS library bundled with numpy in this process."""
    return [controller.num_threads for controller in _numpy_blas()]


def _numpy_blas() -> list:  # type: ignore[type-arg]
    """The controllers (threadpoolctl's) of the BLAS libraries numpy's wheel ships."""
    import numpy  # noqa: F401  (loads its BLAS before the libraries are listed)

    before = os.environ.get(_KMP)
    from threadpoolctl import ThreadpoolController

    if before is None:  # its import's setdefault: not ours to pass on (see the module)
        os.environ.pop(_KMP, None)

    return [lib for lib in ThreadpoolController().lib_controllers
            if lib.user_api == "blas" and "numpy" in str(lib.filepath)]


one_blas_thread()
