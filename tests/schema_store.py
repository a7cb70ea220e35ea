"""The upstream schemas the tests validate against: found, verified, or fetched — never copied.

The real CRDs, OpenShift's OpenAPI and Horreum's OpenAPI are the project's test data, but
they are other projects' files: the repository holds only a pinned list of them
(``tests/schemas.lock.json``: path, URL at a fixed commit, sha256). A file is looked up, in
this order, under

1. every folder named by ``TELLTALE_SCHEMAS_DIR`` (several separated by ``:``), laid out as
   the pinned paths (``crds/upstream/...``, ``apis/horreum/...``) — CI points it at
   ``../shared``; a folder named like the first part of a path (``../shared/crds``) is
   accepted as that part;
2. the cache that ``./telltale fetch-schemas`` fills (``$XDG_CACHE_HOME/telltale/schemas``,
   ``~/.cache/telltale/schemas`` by default).

A file is used only when its sha256 matches the pin: a stale or edited copy is an error that
names it, not a silent pass. When a schema cannot be found, the tests that need it are
skipped with one stated reason (:data:`MISSING_REASON`); with ``TELLTALE_REQUIRE_SCHEMAS``
set (``.ci/run`` sets it) they fail instead.

Standard library only: ``python3 -m tests.schema_store fetch`` works before any venv exists.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

LOCK = Path(__file__).with_name("schemas.lock.json")
ENV_DIRS = "TELLTALE_SCHEMAS_DIR"
ENV_REQUIRE = "TELLTALE_REQUIRE_SCHEMAS"
# Replaces the pinned URLs' host part, for a mirror (and for the fetcher's own tests).
ENV_MIRROR = "TELLTALE_SCHEMAS_MIRROR"
PINNED_HOST = "https://raw.githubusercontent.com/"
MISSING_REASON = (f"upstream schemas absent: run `./telltale fetch-schemas` or set {ENV_DIRS} "
                  "(CI: ../shared)")
_TIMEOUT_S = 30.0
_MAX_BYTES = 32 * 1024 * 1024


class SchemaError(RuntimeError):
    """A pinned schema is missing, differs from its pin, or could not be fetched."""


@dataclass(frozen=True)
class Pinned:
    """One pinned upstream file."""

    path: str
    url: str
    sha256: str


@functools.cache
def pinned() -> tuple[Pinned, ...]:
    """The pinned list, as the repository holds it."""
    doc = json.loads(LOCK.read_text(encoding="utf-8"))
    return tuple(Pinned(f["path"], f["url"], f["sha256"]) for f in doc["files"])


def _pin(path: str) -> Pinned:
    for pin in pinned():
        if pin.path == path:
            return pin
    raise KeyError(f"{path} is not in {LOCK.name}")


def cache_dir() -> Path:
    """Where ``fetch`` puts the files."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "telltale" / "schemas"


def search_roots() -> list[Path]:
    """The folders searched, in order."""
    roots = [Path(p) for p in os.environ.get(ENV_DIRS, "").split(os.pathsep) if p]
    return [*roots, cache_dir()]


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _candidates(root: Path, path: str) -> list[Path]:
    first, _, rest = path.partition("/")
    out = [root / path]
    if root.name == first:
        out.append(root / rest)
    return out


@functools.cache
def _locate(path: str, roots: tuple[Path, ...]) -> Path | None:
    pin = _pin(path)
    for root in roots:
        for candidate in _candidates(root, path):
            if not candidate.is_file():
                continue
            if _digest(candidate) != pin.sha256:
                raise SchemaError(f"{candidate} differs from its pin in {LOCK.name} "
                                  f"(sha256 {pin.sha256[:12]}…): refresh it with "
                                  "`./telltale fetch-schemas` or fix the copy")
            return candidate
    return None


def locate(path: str) -> Path | None:
    """The verified local copy of a pinned file, or None when no root holds it.

    Raises:
        SchemaError: A copy exists but its sha256 differs from the pin.
    """
    return _locate(path, tuple(search_roots()))


def missing() -> list[str]:
    """The pinned paths no root holds."""
    return [pin.path for pin in pinned() if locate(pin.path) is None]


def require(path: str) -> Path:
    """The verified copy of ``path``; in a test, skip (or fail when required) without it."""
    found = locate(path)
    if found is not None:
        return found
    import pytest  # only tests call this; the CLI below runs without pytest

    if os.environ.get(ENV_REQUIRE):
        pytest.fail(f"{MISSING_REASON} ({ENV_REQUIRE} is set; {path} not found under "
                    f"{', '.join(map(str, search_roots()))})", pytrace=False)
    pytest.skip(MISSING_REASON)


def _url(pin: Pinned) -> str:
    mirror = os.environ.get(ENV_MIRROR)
    if mirror and pin.url.startswith(PINNED_HOST):
        return mirror.rstrip("/") + "/" + pin.url[len(PINNED_HOST):]
    return pin.url


def fetch(dest: Path | None = None, *, log=print) -> int:  # noqa: ANN001 - a print-like
    """Download every pinned file that ``dest`` lacks; returns how many were fetched.

    Each file is verified against its sha256 before it takes its final name (a temporary
    file in the same folder, then a rename), so an interrupted or tampered download leaves
    nothing under the final name.

    Raises:
        SchemaError: A download failed or did not match its pin (names the file and URL).
    """
    dest = dest or cache_dir()
    fetched = 0
    for pin in pinned():
        target = dest / pin.path
        if target.is_file() and _digest(target) == pin.sha256:
            continue
        url = _url(pin)
        try:
            with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as answer:  # noqa: S310
                data = answer.read(_MAX_BYTES + 1)
        except OSError as exc:
            raise SchemaError(f"could not fetch {pin.path} from {url}: {exc}") from exc
        if len(data) > _MAX_BYTES or hashlib.sha256(data).hexdigest() != pin.sha256:
            raise SchemaError(f"{url} does not match its pin in {LOCK.name} "
                              f"(sha256 {pin.sha256[:12]}…): nothing written")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fetched += 1
        log(f"fetched {pin.path}")
    _locate.cache_clear()
    return fetched


def main(argv: list[str] | None = None) -> int:
    """``fetch`` the pinned schemas into the cache, ``check`` that every one is found."""
    parser = argparse.ArgumentParser(prog="telltale fetch-schemas", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("action", nargs="?", choices=["fetch", "check"], default="fetch")
    parser.add_argument("--dest", type=Path, help="folder to fetch into (default: the cache)")
    args = parser.parse_args(argv)
    try:
        if args.action == "fetch":
            count = fetch(args.dest)
            print(f"schemas: {count} fetched, {len(pinned()) - count} already there, "
                  f"in {args.dest or cache_dir()}")
            return 0
        absent = missing()
    except SchemaError as exc:
        print(f"telltale: {exc}", file=sys.stderr)
        return 1
    if absent:
        print(f"telltale: {len(absent)} of {len(pinned())} upstream schemas not found "
              f"(searched {', '.join(map(str, search_roots()))}; first: {absent[0]}): "
              f"{MISSING_REASON}", file=sys.stderr)
        return 1
    print(f"schemas: all {len(pinned())} found and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
