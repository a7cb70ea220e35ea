"""The memo's stamps taken by two processes (`analysis.memo.Before`'s ``share``), checked
in a fresh interpreter: a test process has threads, and `core.forked` never forks beside
one (the tree would be stamped in one process, and nothing here proven).

``python -m tests.analysis.memo_share_probe ROOT`` prints one JSON line: whether a child
could be forked, and each failed check (none: every check held).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from analysis import memo
from core.forked import can_fork
from tests.analysis.test_memo import MUTATIONS, _build, _entries, tick_past

# entries in both halves of the root (sorted: a-b stamped beside, c-d here), nested, with
# a name no line holds plainly
TREE = {"a": {"x": b"1", "y": {"z": b"2"}}, "b": b"3", "c\tq": {"w": b"4"}, "d": b"5"}


def _lines(before: memo.Before) -> list[bytes]:
    return sorted(before.lines())


def main(root: Path) -> int:
    memo.SETTLED_NS = 0  # tick_past waits for the clock instead
    failed: list[str] = []
    forked = can_fork()
    for kind in sorted(MUTATIONS):
        for half in (0, 1):
            tree = root / f"{kind.replace(' ', '_').replace(chr(39), '')}-{half}"
            _build(tree, TREE)
            files, dirs = _entries(tree)
            tick_past(tree)
            alone = memo.Before([("tree", tree, True)])
            shared = memo.Before([("tree", tree, True)], then=lambda listings: listings,
                                 share=True)
            listed = shared.take()
            if forked and shared._own is None:  # noqa: SLF001 - the split is what is checked
                failed.append("not split")
            if _lines(shared) != _lines(alone):
                failed.append(f"{kind}: the shared stamps differ from one process's")
            if sorted(listed) != sorted(str(d) for d in dirs):
                failed.append(f"{kind}: the listings name {sorted(listed)}")
            if not shared.held():
                failed.append(f"{kind}: an untouched tree did not hold")
            # a target in the half stamped beside (a...) or in the half stamped here (c...)
            target = [f for f in files if f.relative_to(tree).parts[0][0] == "ac"[half]][0]
            MUTATIONS[kind](target, target.parent)
            if shared.held():
                failed.append(f"{kind} in half {half} was not seen")
            alone.close()
            shared.close()
    print(json.dumps({"can_fork": forked, "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
