"""A new Prefect home's database, copied from a migrated one instead of migrated again.

A Prefect server that finds no database creates it: Alembic runs every migration (114 for
SQLite in Prefect 3.8) and the block types are registered — ~6 of the ~12 CPU-seconds a
fresh ``prefect server start`` takes on this project's 2-core machine
(`benchmarks/prefect_api_start.py`). The result is the same file for every home of one
Prefect version. So the first server of a version that started on no database *keeps* a copy
of it, made the moment it answers and before any client knows its address (`keep`: SQLite's
own backup, checked to hold nothing but the migrations and the block types, renamed into
place), and every later server that would start on no
database is *seeded* with that copy first (`seed`); its start then finds the schema at head
and the blocks registered.

- **Which copy**: one per Prefect version, SQLite library version and list of migration
  files (`template_path`), in ``<user cache dir>/telltale/prefect-db/``. A copy that fails
  SQLite's ``quick_check`` or holds no Alembic revision is never used (the server then
  migrates as it always did).
- **Only a new database**: a database that exists is never touched, and none is seeded when
  the server's settings name another database (Postgres, a relative or in-memory SQLite) or
  turn ``migrate_on_start`` off (`flows.local_api.server_database` reads them: this layer
  knows nothing of Prefect).
- **Never a failure**: seeding and keeping are best effort; an error is logged and the
  server starts as it would have.
- **Who**: every place that starts a Prefect server seeds its database
  (`flows.local_api`, `flows.api_server`, the tests' `prefect server start`, the flow
  benchmark); only servers without background services keep a copy (theirs holds nothing
  but the migrations and the blocks). ``tests/core/test_prefect_seed.py`` fails when code
  starts a server without seeding.

Standard library only (and platformdirs for the cache dir).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from core.safeio import copy_file, make_dirs

__all__ = ["database_file", "keep", "seed", "seed_for_start", "template_path"]

logger = logging.getLogger("telltale.prefect_seed")

_MIGRATIONS = ("server", "database", "_migrations", "versions", "sqlite")


def database_file(connection_url: str) -> Path | None:
    """The file of a SQLite connection URL with an absolute path, else None.

    ``sqlite+aiosqlite:////home/u/.prefect/prefect.db`` -> ``/home/u/.prefect/prefect.db``;
    another database, an in-memory one or a relative path -> None.
    """
    scheme, sep, rest = connection_url.partition(":///")
    if not sep or scheme.split("+", 1)[0] != "sqlite":
        return None
    path, _, query = rest.partition("?")
    if not path.startswith("/") or path == "/:memory:" or "mode=memory" in query:
        return None
    return Path(path)


def _key() -> str | None:
    """What a template must match: Prefect's version, SQLite's, the migration files."""
    spec = importlib.util.find_spec("prefect")
    if spec is None or not spec.submodule_search_locations:
        return None
    versions = Path(next(iter(spec.submodule_search_locations)), *_MIGRATIONS)
    try:
        names = sorted(os.listdir(versions))
        version = importlib.metadata.version("prefect")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    digest = hashlib.sha256("\n".join([version, sqlite3.sqlite_version, *names]).encode())
    return f"prefect-{version}-sqlite-{sqlite3.sqlite_version}-{digest.hexdigest()[:16]}"


def template_path(cache: Path | None = None) -> Path | None:
    """The migrated database this Prefect would copy (it may not exist yet), or None.

    ``cache``: the dir of templates (default ``<user cache dir>/telltale/prefect-db``).
    """
    key = _key()
    if key is None:
        return None
    if cache is None:
        from platformdirs import user_cache_dir

        cache = Path(user_cache_dir("telltale")) / "prefect-db"
    return cache / f"{key}.db"


def _sound(path: Path) -> bool:
    """Whether ``path`` is a whole SQLite database at some Alembic revision."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro&immutable=1",
                                                uri=True)) as db:
            check = db.execute("PRAGMA quick_check").fetchone()
            revision = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return False
    return check == ("ok",) and revision is not None


_STARTUP_TABLES = frozenset({"alembic_version", "block_type", "block_schema",
                             "block_schema_reference"})
"""The tables a new server fills before it answers: its migrations' and its block types'."""


def _used_tables(path: Path) -> list[str]:
    """The tables of the database ``path`` that hold rows but are none of `_STARTUP_TABLES`.

    A copy must be a new database, not one a client already used (its runs would be in
    every home seeded with it): what is kept is checked, not only when it is taken.
    """
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro&immutable=1",
                                            uri=True)) as db:
        names = [row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return sorted(name for name in names if name not in _STARTUP_TABLES and db.execute(
            f'SELECT 1 FROM "{name}" LIMIT 1').fetchone() is not None)


@contextlib.contextmanager
def _staged(target: Path) -> Iterator[Path]:
    """A new name beside ``target`` to build a file under; whatever is left there goes."""
    staged = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.staged")
    try:
        yield staged
    finally:
        with contextlib.suppress(OSError):
            staged.unlink()


def seed(db: Path | None, cache: Path | None = None) -> bool:
    """Put the template at ``db`` when there is no database there; True when it did.

    Nothing is replaced: the copy is linked into place (never over a file that appeared
    meanwhile), and a database with its write-ahead log but no main file is left alone.
    """
    if db is None or db.exists() or Path(f"{db}-wal").exists():
        return False
    template = template_path(cache)
    if template is None or not template.is_file() or not _sound(template):
        return False
    with _staged(db) as staged:
        try:
            make_dirs(db.parent)
            copy_file(template, staged)
            os.link(staged, db)  # no clobber: a database that appeared meanwhile is kept
        except FileExistsError:
            return False
        except Exception as exc:  # best effort: the server migrates as always
            logger.warning("the Prefect database %s was not seeded: %s", db, exc)
            return False
    return True


def keep(db: Path | None, cache: Path | None = None) -> bool:
    """Keep a copy of the new database ``db`` as this Prefect's template; True when kept.

    Call it once the server that created ``db`` answers, before any client uses it. A
    template already there is kept as it is.
    """
    template = template_path(cache)
    if db is None or template is None or template.exists() or not db.is_file():
        return False
    with _staged(template) as staged:
        try:
            make_dirs(template.parent)
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as source, \
                    contextlib.closing(sqlite3.connect(staged)) as copy:
                source.backup(copy)  # a consistent copy of a database in use (its WAL too)
            if not _sound(staged):
                logger.warning("the copy of %s failed its check: not kept", db)
                return False
            used = _used_tables(staged)
            if used:  # a client was faster (two servers on one new home): not a new database
                logger.warning("%s already holds rows in %s: not kept as a template", db,
                               ", ".join(used[:5]))
                return False
            # safeio-exempt: SQLite wrote the copy (its backup API), checked; renamed into place
            os.replace(staged, template)
        except Exception as exc:  # best effort: nothing depends on it
            logger.warning("the Prefect database %s was not kept as a template: %s", db, exc)
            return False
    return True


def seed_for_start(db: Path | None, cache: Path | None = None) -> Callable[[], bool]:
    """Seed ``db`` before a server starts on it; returns what to call once it answers.

    That call keeps ``db`` as the template (`keep`) when this server migrates a new
    database itself (there was no template to seed it with), and does nothing otherwise.
    """
    fresh = not seed(db, cache) and db is not None and not db.exists()
    return (lambda: keep(db, cache)) if fresh else (lambda: False)
