"""How a Telltale command ends once its work is done: what ``sys.exit`` does, less the teardown.

A normal exit waits for the non-daemon threads, runs the ``atexit`` handlers, flushes the
standard streams, then *finalizes the interpreter*: every module torn down, every object
freed one by one, extension modules' destructors run. That last part writes nothing the
kernel would not do anyway when the process ends, and it costs (measured on the 2-core
machine, docs/performance.md): **~1.1 s** after a `python -m flows.fine_tuning` run (Prefect,
pandas, pyarrow imported), **~0.24 s** after `python -m analysis` on 1 000 dirs, **~1.9 s**
after a load step forked from a warm Python with GuideLLM imported, 2.7-3.3 s after the
trainer (torch, transformers). Every run paid it between its last line and its exit.

`exit_now` does the first three steps as Python does them, in the same order, then ends the
process with ``os._exit``:

1. non-daemon threads are joined (``threading``'s own shutdown step);
2. ``atexit`` handlers run, last registered first (logging's flush and close, Prefect's
   services' drains, ``weakref.finalize`` objects registered for exit, temporary dirs);
3. ``sys.stdout`` and ``sys.stderr`` are flushed (a broken pipe is not an error here).

What is skipped is what finalization does beyond that: ``__del__`` of objects still alive
and the flush of a Python file object nobody closed. Telltale writes every file through
`core.safeio`, which closes what it opens (`tests/core/test_safeio.py` fails on a write that
goes around it), so nothing of ours is left in a buffer. It is used only after a command's
``main`` returned: an exception still takes Python's own path (its traceback, exit 1), and
so does ``sys.exit`` called inside ``main`` (argparse's usage errors, ``--help``).

This is the one place a Telltale process ends with ``os._exit`` (`tests/core/test_exit.py`
audits it); the exceptions there are forked children that must *not* run their parent's
``atexit`` handlers, and a standard-library-only workload script. Standard library only:
workloads import it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

__all__ = ["exit_now"]


def exit_now(code: int | None) -> NoReturn:
    """End the process with ``code`` (None: 0) as ``sys.exit`` would, without the teardown.

    Args:
        code: The exit status, as a ``main`` returns it.
    """
    status = 0 if code is None else int(code)
    try:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon and thread.is_alive():
                thread.join()
        atexit._run_exitfuncs()  # the handlers, in Python's order; each one's error printed
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):  # closed or broken (`| head`): nothing to say
                pass
        os._exit(status)
