"""The one way Telltale writes a file, and the one way it reads an untrusted one.

Writes (every output: Parquet, JSON, YAML, HTML, copied assets, history parts, caches, lease
and outcome files) go through `atomic_open` and its shorthands:

- the data goes to a temporary file created in the target's own directory with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (no existing file, and no link, is ever opened);
- it is flushed and ``fsync``-ed, then renamed over the target (``os.replace``: atomic on one
  file system), so a reader sees the old file or the whole new one, never a part;
- a target that is a symbolic link is refused and named (`UnsafeOutputError`): a results or
  output tree planted with ``report/index.html -> ~/.bashrc`` cannot make Telltale overwrite
  what the link points at (the rename would replace the link itself, but refusing says so
  instead of silently dropping what the user linked);
- any failure (a full disk, a read-only dir) removes the temporary file and raises
  `OutputError` naming the target path: nothing partial is ever left under a final name.

Streams that grow while a step runs (a workload's log, a step log) are not atomic by nature;
`open_append` opens them without following a link.

Reads of files that come from outside (command-line files, result trees, history parts) go
through `read_bounded`: regular files only (a FIFO or a device is refused, never opened for a
blocking read), no link followed, and a size cap checked before and while reading.

``tests/analysis/test_safeio.py`` fails when code under the packages writes a file any other way.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import stat
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Literal, overload

from core.errors import TelltaleError, UserError
from core.redact import redact, redact_bytes

__all__ = [
    "OutputError",
    "RefusedInput",
    "UnreadableInputError",
    "UnsafeOutputError",
    "atomic_open",
    "copy_file",
    "link_file",
    "make_dirs",
    "open_append",
    "open_regular",
    "open_stream",
    "output_root",
    "read_bounded",
    "read_text_bounded",
    "write_bytes",
    "write_json",
    "write_text",
    "write_text_parts",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class OutputError(TelltaleError, OSError):
    """A file could not be written; ``path`` names it (never the directory around it).

    An `OSError` too, so callers that treat a full disk as an `OSError` keep doing so.
    """

    def __init__(self, message: str, *, path: str | Path,
                 code: int | None = None) -> None:
        self.path = str(path)
        OSError.__init__(self, code or 0, message)
        self.filename = self.path
        self.strerror = message

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.strerror}"


class UnsafeOutputError(OutputError, UserError):
    """The target is a symbolic link (or not a regular file): refused, nothing written."""


class UnreadableInputError(UserError):
    """An input file is not a regular file, is too large, or cannot be read.

    Attributes:
        path: The file.
        reason: What is wrong with it, in a few words.
    """

    def __init__(self, path: str | Path, reason: str, *, what: str = "file") -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{what} {self.path}: {reason}")


_ROOTS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "telltale_output_roots", default=())


@contextlib.contextmanager
def output_root(path: str | Path) -> Iterator[Path]:
    """Make writes under ``path`` refuse a link anywhere below it, not only at the target.

    A planted ``report -> /elsewhere`` dir would otherwise take every page. The root itself
    may be a link (the user named it); each dir between it and a target is checked with
    ``lstat`` before the write.
    """
    token = _ROOTS.set((*_ROOTS.get(), os.path.abspath(path)))
    try:
        yield Path(path)
    finally:
        _ROOTS.reset(token)


def _check_parents(target: Path) -> None:
    parent = os.path.abspath(os.path.dirname(target))
    for root in _ROOTS.get():
        if parent != root and not parent.startswith(root + os.sep):
            continue
        current = root
        for part in parent[len(root):].split(os.sep):
            if not part:
                continue
            current = os.path.join(current, part)
            if os.path.islink(current):
                raise UnsafeOutputError(f"{current} on its way is a symbolic link; Telltale "
                                        "never writes through a link", path=target)


def make_dirs(path: str | Path) -> Path:
    """Create ``path`` and its missing parents, refusing a link on the way.

    Under an active output root, ``mkdir -p`` would create the new dirs wherever a planted
    link points; each dir between the root and ``path`` is checked first.

    Raises:
        UnsafeOutputError: A dir between the active output root and ``path`` is a link.
    """
    target = Path(path)
    _check_parents(target / "_")  # every dir up to and including ``path``
    target.mkdir(parents=True, exist_ok=True)
    return target


def _check_target(path: Path, *, parents: bool = True) -> None:
    if parents:
        _check_parents(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(exc.strerror or type(exc).__name__, path=path,
                          code=exc.errno) from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeOutputError("it is a symbolic link; Telltale never writes through a link "
                                "(remove it, or choose another output dir)", path=path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeOutputError("it exists and is not a regular file", path=path)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on device"
    return exc.strerror or str(exc) or type(exc).__name__


@overload
def atomic_open(path: str | Path, mode: Literal["wb"] = "wb") -> contextlib.AbstractContextManager[IO[bytes]]: ...  # noqa: E501


@overload
def atomic_open(path: str | Path, mode: Literal["w"]) -> contextlib.AbstractContextManager[IO[str]]: ...  # noqa: E501


@contextlib.contextmanager  # type: ignore[misc]
def atomic_open(path: str | Path, mode: str = "wb", *, private: bool = False,
                durable: bool = True) -> Iterator[IO[Any]]:
    """Open ``path`` for writing so that it appears whole or not at all.

    Args:
        path: The final file name; its directory must exist.
        mode: ``"wb"`` (bytes) or ``"w"`` (UTF-8 text).
        private: A file only its owner may read (mode 0600): a kubeconfig, an install
            config, the few files that must hold a credential.
        durable: fsync before the rename (a crash keeps the old file or the whole new
            one). A cache, which is made again when lost, passes False: still atomic for
            readers, without a disk flush per result dir.

    Yields:
        A file object on a temporary file in the same directory; it is renamed over
        ``path`` when the block ends without an exception, and removed otherwise.

    Raises:
        UnsafeOutputError: ``path`` is a symbolic link or not a regular file.
        OutputError: The write, the fsync or the rename failed (a full disk...), naming
            ``path``; no temporary file is left.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "a.txt"
        >>> with atomic_open(target, "w") as stream:
        ...     _ = stream.write("hello")
        >>> target.read_text()
        'hello'
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open mode must be 'wb' or 'w', not {mode!r}")
    target = Path(path)
    _check_target(target)
    tmp = target.with_name(f".{target.name[:200]}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                     0o600 if private else 0o644)
    except OSError as exc:
        raise OutputError(_reason(exc), path=target, code=exc.errno) from None
    stream: IO[Any] = (os.fdopen(fd, "wb") if mode == "wb"
                       else os.fdopen(fd, "w", encoding="utf-8", newline=""))
    done = False
    try:
        try:
            yield stream
            stream.flush()
            if durable:
                os.fsync(stream.fileno())
        finally:
            stream.close()
        _check_target(target, parents=False)  # a link planted while we wrote is refused too
        os.replace(tmp, target)
        done = True
    except OSError as exc:
        if isinstance(exc, OutputError):
            raise
        raise OutputError(_reason(exc), path=target, code=exc.errno) from exc
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_bytes(path: str | Path, data: bytes, *, private: bool = False,
                durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (see `atomic_open`); returns the path.

    Every registered secret value (`core.redact.register_secret`) is masked in what is
    written, unless ``private``: a 0600 file that must hold a credential (a kubeconfig, an
    install config).
    """
    with atomic_open(path, "wb", private=private, durable=durable) as stream:
        stream.write(data if private else redact_bytes(data))
    return Path(path)


def write_text(path: str | Path, text: str, *, private: bool = False,
               durable: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see `write_bytes`."""
    return write_bytes(path, text.encode("utf-8"), private=private, durable=durable)


def write_text_parts(path: str | Path, parts: Iterable[str], *, durable: bool = True) -> Path:
    """Write the concatenation of ``parts`` (UTF-8) atomically, one part in memory at a time.

    For a large page made of fragments (a report's history page: 8 MB at 10 000 runs): the
    whole text, its bytes and its masked copy were three more copies at once. Registered
    secrets are masked in each part; each part is a whole fragment (a figure, a table), so
    a value written by the analysis lies within one.
    """
    with atomic_open(path, "wb", durable=durable) as stream:
        for part in parts:
            stream.write(redact_bytes(part.encode("utf-8")))
            del part  # not held while the next part is made
    return Path(path)


def write_json(path: str | Path, data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON atomically, secrets redacted by key and by value.

    Non-JSON values are written as their ``str``; see `core.redact.redact`.
    """
    return write_text(path, json.dumps(redact(data), indent=indent, default=str) + "\n")


def copy_file(source: str | Path, target: str | Path, *, chunk: int = 1 << 20) -> Path:
    """Copy a regular file's bytes to ``target`` atomically; returns the target.

    Raises:
        UnreadableInputError: ``source`` is not a regular file (a link is not followed).
        OutputError: The target could not be written.
    """
    try:
        fd = open_regular(source)
    except RefusedInput as exc:
        raise UnreadableInputError(source, exc.reason) from None
    with os.fdopen(fd, "rb") as reader:
        with atomic_open(target, "wb") as writer:
            while block := reader.read(chunk):
                writer.write(block)
    return Path(target)


def link_file(source: str | Path, target: str | Path) -> bool:
    """Hard-link a regular file at ``target``, atomically: one copy shared by many dirs.

    For large read-only files every report carries (plotly.js): each dir still holds the
    file (it opens offline, an export uploads it), the disk holds it once. False when this
    filesystem cannot link (another device, no hard links): the caller writes a copy.

    Raises:
        UnsafeOutputError: ``target`` is a symbolic link (never replaced through).
        OutputError: The link was made but could not be put in place.
    """
    target = Path(target)
    if target.is_symlink():
        raise UnsafeOutputError(f"{target} is a symbolic link: not replaced", path=target)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.link")
    try:
        os.link(source, temporary, follow_symlinks=False)
    except OSError:
        return False
    try:
        os.replace(temporary, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise OutputError(f"{target}: {exc.strerror or exc}", path=target,
                          code=exc.errno) from exc
    return True


def open_append(path: str | Path) -> IO[bytes]:
    """Open a growing log for appending, creating it, never through a link.

    Raises:
        UnsafeOutputError: ``path`` is a symbolic link (or a FIFO, a device...).
        OutputError: It cannot be opened.
    """
    target = Path(path)
    _check_parents(target)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW | _NONBLOCK
                     | _CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeOutputError("it is a symbolic link; Telltale never writes through a "
                                    "link", path=target) from None
        raise OutputError(_reason(exc), path=target, code=exc.errno) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeOutputError("it exists and is not a regular file", path=target)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def _open_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link: not followed"
    if exc.errno == errno.ENOENT:
        return "file not found"
    return f"cannot read: {exc.strerror or exc}"


class RefusedInput(Exception):
    """Why `open_regular` refused a file: ``reason`` (a few words) and ``kind``.

    Not a `TelltaleError`: each reader turns it into its own outcome (an
    `UnreadableInputError`, or a problem recorded on a parsed run).
    """

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind  # "link", "special", "size", "replaced", "missing", "error"


def open_regular(path: str | Path, *, max_bytes: int | None = None,
                 follow_links: bool = False, known: os.stat_result | None = None) -> int:
    """Open a regular file for reading, the one way every untrusted input is opened.

    ``lstat`` first (a device or a FIFO is never even opened: opening some devices acts),
    then ``open`` without following a link and without blocking, then ``fstat``: it must be
    the same regular file, so a swap between the check and the open can neither follow a
    link nor hang on a FIFO.

    Args:
        path: The file.
        max_bytes: Refuse a larger file (None: any size; a streaming reader caps its reads).
        follow_links: Follow a link the user named (a CLI file, a mounted secret).
        known: The caller's own ``lstat`` of ``path`` (a result-tree reader fingerprints it).

    Returns:
        A read-only file descriptor (non-blocking, which changes nothing for a regular
        file); the caller closes it.

    Raises:
        RefusedInput: With ``reason`` and ``kind``; `read_bounded` and the result-tree
            reader turn it into their own error or recorded problem.
    """
    try:
        st = known if known is not None else (os.stat(path) if follow_links else os.lstat(path))
    except FileNotFoundError:
        raise RefusedInput("file not found", "missing") from None
    except OSError as exc:
        raise RefusedInput(_open_reason(exc), "error") from None
    if stat.S_ISLNK(st.st_mode):
        raise RefusedInput("a symbolic link: not followed", "link")
    if not stat.S_ISREG(st.st_mode):
        raise RefusedInput("not a regular file (a FIFO, device or directory is never read)",
                       "special")
    if max_bytes is not None and st.st_size > max_bytes:
        raise RefusedInput(f"{st.st_size} bytes, over the {max_bytes} accepted", "size")
    try:
        fd = os.open(path, os.O_RDONLY | (0 if follow_links else _NOFOLLOW) | _NONBLOCK
                     | _CLOEXEC)
    except OSError as exc:
        kind = "link" if exc.errno == errno.ELOOP else "error"
        raise RefusedInput(_open_reason(exc), kind) from None
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise RefusedInput("replaced while being read", "replaced")
    return fd


def open_stream(path: str | Path, *, max_bytes: int | None = None,
                follow_links: bool = False) -> IO[bytes]:
    """`open_regular` as a binary stream; the caller closes it.

    For a reader that reads part of a file (a tail, a header line).

    Raises:
        RefusedInput: As `open_regular` (a FIFO, a device, a link, over ``max_bytes``).
    """
    return os.fdopen(open_regular(path, max_bytes=max_bytes, follow_links=follow_links), "rb")


def read_bounded(path: str | Path, max_bytes: int, *, what: str = "file",
                 follow_links: bool = False) -> bytes:
    """Read a whole regular file of at most ``max_bytes`` bytes.

    The file is opened without following a link and without blocking (a FIFO would wait
    for a writer forever), checked to be a regular file, and read up to one byte past the
    cap, so a file that grows while read (``/dev/zero`` is refused earlier, a growing log is
    not) cannot exhaust memory.

    Args:
        path: The file.
        max_bytes: The largest size accepted.
        what: What the file is, for the message (``"PR comment"``, ``"vars file"``).
        follow_links: Follow a symbolic link (a file the user named on the command line,
            a mounted secret); result trees and history parts never do.

    Returns:
        The bytes.

    Raises:
        UnreadableInputError: Not found, a link, not a regular file, too large, unreadable;
            one line naming the file and the cap.
    """
    try:
        fd = open_regular(path, max_bytes=max_bytes, follow_links=follow_links)
    except RefusedInput as exc:
        raise UnreadableInputError(path, exc.reason, what=what) from None
    with os.fdopen(fd, "rb") as stream:
        try:
            data = stream.read(max_bytes + 1)
        except OSError as exc:
            raise UnreadableInputError(path, f"cannot read: {exc.strerror}", what=what) from None
    if len(data) > max_bytes:
        raise UnreadableInputError(path, f"over the {max_bytes} bytes accepted", what=what)
    return data


def read_text_bounded(path: str | Path, max_bytes: int, *, what: str = "file",
                      follow_links: bool = False) -> str:
    """`read_bounded`, decoded as UTF-8 (a decoding error is an `UnreadableInputError`)."""
    data = read_bounded(path, max_bytes, what=what, follow_links=follow_links)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableInputError(path, f"not UTF-8 text (byte {exc.start})",
                                   what=what) from None
