"""Reading an ``.npz`` that came from elsewhere without trusting it: every array's ``.npy`` header is read first
(a few hundred bytes), its dtype and shape checked, and its size checked against the zip member that holds it and
against a total bound, before any array is allocated. ``numpy.load`` allocates whatever a member's header says
(a corrupt shape of 10^12 asks for terabytes) and lets ``zlib.error`` / ``zipfile.BadZipFile`` /
``NotImplementedError`` through; here each is a :class:`~specter_lab.errors.TraceError` that says "truncated or
corrupt", and the file is closed whatever happens (``with``)."""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import TraceError

__all__ = ["NpzArchive", "ArrayHeader", "read_npz", "read_npy", "MAX_NPZ_BYTES"]

MAX_NPZ_BYTES = 8 * 2**30  # all arrays of one file, uncompressed: far above any trace, far below a zip bomb
_MAX_NDIM = 8
# everything zipfile, zlib and numpy's .npy reader raise on a damaged file
_CORRUPT = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError, KeyError,
            NotImplementedError, RuntimeError, struct.error, OverflowError, UnicodeDecodeError, SyntaxError,
            TypeError, IndexError)


@dataclass(frozen=True)
class ArrayHeader:
    """One array of the archive as its ``.npy`` header states it (checked against the member's size)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


class NpzArchive:
    """An ``.npz`` opened for checked reading: :attr:`arrays` (name → :class:`ArrayHeader`) is known on entry,
    :meth:`read` allocates one array. ``what`` and ``fix`` word the refusals: ``{path} {what} (...). {fix}``."""

    def __init__(self, path: "str | Path", what: str, fix: str, max_bytes: int = MAX_NPZ_BYTES) -> None:
        self.path, self.what, self.fix, self.max_bytes = Path(path), what, fix, max_bytes
        self._zf: zipfile.ZipFile | None = None
        self.arrays: dict[str, ArrayHeader] = {}
        self._members: dict[str, zipfile.ZipInfo] = {}

    def corrupt(self, detail: str) -> TraceError:
        return TraceError(f"{str(self.path)!r} {self.what} (truncated or corrupt: {detail}). {self.fix}")

    def __enter__(self) -> "NpzArchive":
        try:
            self._zf = zipfile.ZipFile(self.path)
            self._index()
        except TraceError:
            self.close()
            raise
        except _CORRUPT:
            self.close()
            raise self.corrupt("not a zip archive, or its directory or an array header is damaged") from None
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._zf is not None:
            self._zf.close()
            self._zf = None

    def _index(self) -> None:
        total = 0
        for info in self._zf.infolist():
            if info.is_dir():
                continue
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name in self.arrays:
                raise self.corrupt(f"array {name!r} stored twice")
            header, offset = self._header(info)
            nbytes = int(np.prod(header.shape, dtype=np.float64)) * header.dtype.itemsize
            if nbytes + offset != info.file_size:
                raise self.corrupt(f"array {name!r}: its header says {header.shape} {header.dtype} "
                                   f"({nbytes} bytes), its member holds {info.file_size - offset}")
            total += nbytes
            if total > self.max_bytes:
                raise TraceError(f"{str(self.path)!r} {self.what}: its arrays hold over {self.max_bytes / 2**30:.0f} "
                                 f"GiB uncompressed (refused before reading). {self.fix}")
            self.arrays[name] = header
            self._members[name] = info

    def _header(self, info: zipfile.ZipInfo) -> tuple[ArrayHeader, int]:
        with self._zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise self.corrupt(f"member {info.filename!r}: .npy version {version}")
            offset = f.tell()
        name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        if dtype.hasobject or dtype.kind not in "biufcSU":
            raise TraceError(f"{str(self.path)!r} {self.what} (truncated or corrupt, or holds pickled objects: array "
                             f"{name!r} has dtype {dtype}; pickles and records are never loaded). {self.fix}")
        if len(shape) > _MAX_NDIM or any((not isinstance(d, int)) or d < 0 for d in shape):
            raise self.corrupt(f"array {name!r}: shape {shape}")
        return ArrayHeader(name, tuple(int(d) for d in shape), dtype), offset

    def read(self, name: str) -> np.ndarray:
        """The array ``name`` (its size was checked on entry), without pickle."""
        info = self._members[name]
        try:
            with self._zf.open(info) as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        except _CORRUPT:
            raise self.corrupt(f"array {name!r} does not decompress to the data its header states") from None


def read_npz(path: "str | Path", what: str, fix: str, max_bytes: int = MAX_NPZ_BYTES) -> dict[str, np.ndarray]:
    """Every array of an ``.npz``, checked as :class:`NpzArchive` checks them; a truncated, corrupt, oversized or
    pickled file is a :class:`TraceError` that says ``{path} {what} (...). {fix}``."""
    with NpzArchive(path, what, fix, max_bytes) as z:
        return {name: z.read(name) for name in z.arrays}


def read_npy(path: "str | Path", what: str, fix: str, max_bytes: int = MAX_NPZ_BYTES) -> np.ndarray:
    """One ``.npy`` array, its header checked against the file's size and ``max_bytes`` before allocating."""
    path = Path(path)
    where = repr(str(path))
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
            if dtype.hasobject or dtype.kind not in "biufc" or len(shape) > _MAX_NDIM:
                raise TraceError(f"{where} {what} (truncated or corrupt, or holds pickled objects: dtype {dtype}, "
                                 f"shape {shape}). {fix}")
            nbytes = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
            size = path.stat().st_size
            if nbytes > max_bytes or nbytes + offset != size:
                raise TraceError(f"{where} {what} (truncated or corrupt: its header says {shape} {dtype}, "
                                 f"{nbytes} bytes; the file holds {size - offset}). {fix}")
            f.seek(0)
            return np.lib.format.read_array(f, allow_pickle=False)
    except TraceError:
        raise
    except _CORRUPT:
        raise TraceError(f"{where} {what} (truncated or corrupt: not a .npy array). {fix}") from None
