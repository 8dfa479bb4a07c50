"""Every file the package writes, written whole or not at all: a temporary file in the destination's folder,
flushed and fsynced, then ``os.replace`` onto the final name and the folder fsynced. A kill, an error or a full
disk at any moment leaves either the old file or the new one under the final name, never a part of either.

Two ways in, one way out: :func:`write_atomic` for content held in memory (bytes or text: its size is known, so a
disk or a file-size limit too small for it is refused before a byte is written), :func:`atomic_open` for a writer
that streams (``json.dump``, ``DataFrame.to_csv``, a CSV loop); and :func:`append_line` for the one file kind
that grows in place, a JSON Lines results log (a whole line or nothing: a failed append is cut back). On any
error the temporary file is removed and the error raised; a full disk (``ENOSPC``, ``EDQUOT``) or a file-size
limit (``EFBIG``: ``ulimit -f`` / ``RLIMIT_FSIZE`` with ``SIGXFSZ`` ignored) is raised as
:class:`~specter_lab.errors.DiskFull`, naming the path and the bytes needed. A temporary left by a writer that
was killed (``.<name>.<pid>.<random>.tmp``, never the final name) is removed by the next successful write of the
same file once that process is gone.

Why our own ~150 lines and not a library: ``atomicwrites`` (the usual answer) has been archived by its author
since 2022; ``boltons.fileutils.AtomicSaver`` is maintained, but its fixed ``<name>.part`` temporary, once a
killed writer leaves it, makes the next save fail unless told to overwrite it, and it gives a full disk no
message of its own; ``safer`` wraps streams and sockets too, one maintainer, more than a save needs;
``atomicfile`` has not changed since 2020. None knows the sizes up front, so none can say "needs 12 MB, 3 MB
free" before writing. The standard library has every piece (``os.replace`` is atomic on POSIX and Windows).

The writers that use it (``grep -rn "atomic" specter_lab scripts``; ``tests/test_resume.py`` checks no other
``open(..., "w")`` is left in the package):

- ``RoutingTrace.save`` (``traces/trace_file.py``) and so ``sl.record(out=)``, ``specter-lab trace record /
  import``; ``RoutingTrace.export`` / ``specter-lab trace export`` (``traces/formats.py``, every format);
- ``GenerationResult.to_html`` (``run/setup.py``), ``to_perfetto`` (``records/perfetto.py``), ``specter-lab run
  --html / --perfetto`` and ``bench --html`` (``cli.py``);
- the saved profiles: ``calibrate`` (``pricing/calibrate.py``) and ``calibrate_host`` (``pricing/hostcal.py``);
- ``sl.fuse_experts`` (``model/fuse.py``: the folder is built under a temporary name and renamed whole);
- the results logs of ``compare(results=)``, ``bench --results``, ``reproduce_paper(results=)``
  (``studies/results_file.py``: header written whole, cells appended by :func:`append_line`);
- the notebook views: ``Dashboard.export``, ``QuantTuner.save``, ``LiveRun(out=)`` (``viz/widgets.py``,
  ``viz/live_file.py``);
- the scripts that write pages or files under ``docs/``: ``closer_to_bound.py --out`` (and ``--results``),
  ``fault_injection.py``, ``fuzz_readers.py --out``, ``fuzz_checkpoints.py --report``, ``real_checkpoint.py
  --report`` (and its shrunk checkpoint's index, config and sparse shards), ``gpu_check.py``, ``long_run.py
  --json``, ``check_families.py --json``, ``dashboard_png.py``.

Left as they are, on purpose: ``train_tiny_moe.py`` (it makes the bundled model and stands apart from the
package), ``same_floats.py`` (its probe runs inside an older version of the package, into a temporary file),
the fuzzers' scratch inputs (temporary folders), and the checkpoints written by ``safetensors`` /
``save_pretrained`` (their own writers; ``fuse_experts`` renames its whole folder instead). Scripts that print
a page for the shell to redirect (``> docs/measured/x.md``) write nothing themselves: the shell's ``>``
empties the page first, so redirect to a temporary name and ``mv`` it, or use the script's ``--out``.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import shutil
import signal
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from .errors import DiskFull
from .units import format_bytes

try:  # POSIX only: the process's file-size limit
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None

__all__ = ["write_atomic", "atomic_open", "atomic_folder", "append_line", "temp_files", "DiskFull"]

_NO_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def write_atomic(path: "str | os.PathLike", data: "bytes | str", encoding: str = "utf-8") -> Path:
    """Write ``data`` (bytes, or text encoded as ``encoding``) to ``path`` whole or not at all; returns the path.

    A disk or a file-size limit too small for ``len(data)`` is refused before writing (:class:`DiskFull`)."""
    raw = data.encode(encoding) if isinstance(data, str) else bytes(data)
    path = _destination(path)
    _check_room(path, len(raw))
    with atomic_open(path, "wb") as f:
        f.write(raw)
    return path


@contextmanager
def atomic_open(path: "str | os.PathLike", mode: str = "w", encoding: str = "utf-8",
                newline: "str | None" = None) -> Iterator[IO]:
    """A file to write ``path``'s new content into (``mode`` ``"w"`` text or ``"wb"`` binary): it replaces the
    old file when the block ends without an error, and is removed, the old file untouched, when it raises (a
    ``KeyboardInterrupt`` too)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode={mode!r}: atomic_open writes a whole new file, 'w' (text) or 'wb' (binary).")
    path = _destination(path)
    with _no_interrupt():  # a Ctrl-C between creating the temporary and the cleanup below would leave it behind
        tmp, fd = _temp_for(path)
        try:
            raw = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            _remove(tmp)
            raise
    f = raw if mode == "wb" else io.TextIOWrapper(raw, encoding=encoding, newline=newline)
    try:
        try:
            yield f
            f.flush()
            os.fsync(raw.fileno())
        except OSError as exc:
            full = _no_room(exc, path, _size(raw))
            if full is exc:
                raise
            raise full from exc
        finally:
            _close_quietly(f)
        if path.exists():  # keep the old file's permissions (the temporary is made 0o666 & ~umask)
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    _fsync_folder(path.parent)
    _sweep(path)


def append_line(path: "str | os.PathLike", line: str, encoding: str = "utf-8") -> None:
    """Append one line (``line`` without its newline) to ``path`` and fsync it: the whole line or nothing. A
    failed write is cut back to the file's size before it, so the file never ends in a part of this line
    (a kill during the write can still leave one: readers drop a torn last line)."""
    raw = (line + "\n").encode(encoding)
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        before = os.fstat(fd).st_size
        try:
            _check_room(path, len(raw), replacing=False)
            view = memoryview(raw)
            while view:  # os.write may write less than asked
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException as exc:
            try:
                os.ftruncate(fd, before)
            except OSError:
                pass
            full = _no_room(exc, path, len(raw), appending=True) if isinstance(exc, OSError) else exc
            if full is exc:
                raise
            raise full from exc
    finally:
        os.close(fd)


@contextmanager
def atomic_folder(path: "str | os.PathLike") -> Iterator[Path]:
    """A new folder to fill: built under a temporary name beside ``path`` and renamed to ``path`` when the block
    ends without an error, removed when it raises. ``path`` must not exist (a folder is never replaced)."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(errno.EEXIST, f"{str(path)!r} exists: give a new folder", str(path))
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"cannot create {str(path)!r}: its folder does not exist", str(path))
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    tmp.mkdir()
    try:
        yield tmp
        for f in tmp.iterdir():  # every file durable before the folder gets its name
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_folder(path.parent)


def temp_files(path: "str | os.PathLike") -> list[Path]:
    """The temporary files a writer of ``path`` has left in its folder (killed before it could remove them)."""
    path = Path(path)
    return sorted(path.parent.glob(f".{path.name}.*.tmp")) if path.parent.is_dir() else []


# ----------------------------------------------------------------------------------------------- the pieces
@contextmanager
def _no_interrupt() -> Iterator[None]:
    """SIGINT held back for a few instructions (POSIX): delivered, as a KeyboardInterrupt, once they are done."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    old = block(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, old)


def _destination(path) -> Path:
    path = Path(path)
    if path.is_symlink():  # replace the file the link points to; the link stays a link
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"{str(path)!r} is a folder: give a file name to write", str(path))
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"cannot write {str(path)!r}: its folder does not exist (create it "
                                "first)", str(path.parent))
    return path


def _temp_for(path: Path) -> "tuple[Path, int]":
    """A new file beside ``path``: same file system (so ``os.replace`` is a rename), hidden, named after its
    writer's pid (so a later write can tell a dead writer's leftover from a live one's)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    while True:
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue


def _check_room(path: Path, needed: int, replacing: bool = True) -> None:
    """Refuse a write that cannot fit before starting it: the folder's free bytes (the old file's blocks are freed
    only after the rename) and the process's file-size limit."""
    limit = _size_limit()
    if limit is not None and needed > limit:
        raise DiskFull(f"cannot write {str(path)!r}: it needs {_bytes(needed)} but this process may write files "
                       f"of at most {_bytes(limit)} (its file-size limit, `ulimit -f`). Nothing was written; "
                       f"{_intact(path, replacing)} Raise the limit and save again.", str(path), needed,
                       _free(path), limit, errno_=errno.EFBIG)
    free = _free(path)
    if free is not None and needed > free:
        raise DiskFull(f"cannot write {str(path)!r}: it needs {_bytes(needed)}, its file system has "
                       f"{_bytes(free)} free. Nothing was written; {_intact(path, replacing)} Free some space (or "
                       "write elsewhere) and save again.", str(path), needed, free, limit, errno_=errno.ENOSPC)


def _no_room(exc: OSError, path: Path, written: int, appending: bool = False) -> OSError:
    """``exc`` as :class:`DiskFull` when the disk or a limit ran out (the bytes written so far: a lower bound of
    what the file needs); any other OSError as it is."""
    if isinstance(exc, DiskFull) or exc.errno not in _NO_ROOM:
        return exc
    why = ("the process's file-size limit (`ulimit -f`) was reached" if exc.errno == errno.EFBIG else
           "the disk (or a quota) filled up")
    free, limit = _free(path), _size_limit()
    room = f"{_bytes(free)} free" if free is not None else "free space unknown"
    if limit is not None:
        room += f", file-size limit {_bytes(limit)}"
    what = (f"it needs {_bytes(written)} more" if appending else
            f"it needs more than the {_bytes(written)} written when it failed")
    return DiskFull(f"cannot write {str(path)!r}: {why} ({what}; {room}). "
                    f"{'The file is as it was before this line' if appending else 'Nothing was replaced'}; "
                    f"{_intact(path, not appending)} Free some space (or raise the limit) and save again.",
                    str(path), written, free, limit, needed_exact=appending, errno_=exc.errno)


def _intact(path: Path, replacing: bool) -> str:
    if not replacing:
        return "what it held is intact."
    return "the file already there is intact." if path.exists() else "no file was created."


def _bytes(n: int) -> str:
    return f"{format_bytes(n)} ({n:,} bytes)"


def _free(path: Path) -> "int | None":
    try:
        return int(shutil.disk_usage(path.parent).free)
    except OSError:
        return None


def _size_limit() -> "int | None":
    if resource is None:
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _size(raw) -> int:
    try:
        return os.fstat(raw.fileno()).st_size
    except (OSError, ValueError):
        return 0


def _close_quietly(f) -> None:
    try:
        f.close()
    except OSError:  # a close whose flush fails (a full disk): the temporary is removed by the caller
        pass


def _remove(tmp: Path) -> None:
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sweep(path: Path) -> None:
    """Remove the temporaries that killed writers of ``path`` left (their pid no longer runs)."""
    for tmp in temp_files(path):
        try:
            pid = int(tmp.name[len(path.name) + 2:].split(".")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            _remove(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # another user's, or a platform that cannot tell: keep it
    return True
