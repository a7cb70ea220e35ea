"""numpy's BLAS runs on one thread wherever the detector runs (`analysis.blas`).

Behaviour: a fresh interpreter that imports the detector has numpy's bundled BLAS on one
thread, where numpy alone starts one a core. Audit: every module of ``analysis/`` that does
linear algebra with numpy imports `analysis.blas` (through `analysis.detector`, or itself),
so no path reaches the BLAS before the limit is set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINEAR_ALGEBRA = re.compile(r"np\.linalg\.|\.polyfit\(|\blstsq\(|np\.dot\(| @ ")
# threadpoolctl read directly: importing analysis.blas would set what is measured
PROBE = ("import json, sys\n"
         "sys.path.insert(0, {root!r})\n"
         "{imports}\n"
         "from threadpoolctl import ThreadpoolController\n"
         "print(json.dumps([lib.num_threads for lib in ThreadpoolController().lib_controllers\n"
         "                  if lib.user_api == 'blas' and 'numpy' in str(lib.filepath)]))\n")


def _threads_after(imports: str) -> list[int]:
    """numpy's BLAS thread counts in a fresh interpreter after ``imports``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), imports=imports)],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    return json.loads(proc.stdout)


def test_the_detector_runs_numpys_blas_on_one_thread() -> None:
    alone = _threads_after("import numpy")
    if not alone:
        pytest.skip("this numpy links no BLAS of its own (a distribution's or MKL): "
                    "analysis.blas leaves it as it is")
    with_detector = _threads_after("import analysis.regression")
    assert with_detector == [1] * len(alone), with_detector
    if len(os.sched_getaffinity(0)) > 1:  # the probe itself can tell the two apart
        assert max(alone) > 1, alone


def test_every_module_doing_linear_algebra_sets_the_limit_first() -> None:
    import grimp

    graph = grimp.build_graph("analysis", cache_dir=None)
    users = sorted(
        f"analysis.{path.stem}" for path in (ROOT / "analysis").glob("*.py")
        if path.stem not in ("blas", "__main__")
        and LINEAR_ALGEBRA.search(path.read_text(encoding="utf-8")))
    assert "analysis.trend" in users  # the audit sees the QR it exists for
    missing = [m for m in users
               if not graph.chain_exists(importer=m, imported="analysis.blas")]
    assert not missing, (f"{missing} use numpy's linear algebra without importing "
                         "analysis.blas (through analysis.detector or directly)")
