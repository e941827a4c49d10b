"""Where things live: the operators' data files, the library cache, the build
directories calls load from, and the tuning records.

The directories are asked on every call; each is worked out once per value of
the environment variables it depends on, so a change of them takes effect at once.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)


def data_file(folder: str, op: str):
    """specs/<op>.yaml or schedules/<op>.yaml: package data of tvm_ops (a Traversable), so
    it is found in an installed wheel as in a checkout."""
    return resources.files(f"tvm_ops.{folder}").joinpath(f"{op}.yaml")


def file_bytes(path: Path) -> bytes:
    """The bytes of the regular file `path`; OSError for anything else there (a fifo or a
    device would block the read for ever: a cache or records file is never one)."""
    if not path.is_file():
        raise OSError(f"{path} is not a regular file")
    return path.read_bytes()


def cache_dir() -> Path:
    """Where built libraries go: $TVM_OPS_CACHE_DIR, else $XDG_CACHE_HOME/tvm_ops, else ~/.cache/tvm_ops."""
    return _cache_dir(os.environ.get("TVM_OPS_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME"),
                      os.environ.get("HOME"))


@functools.lru_cache(maxsize=8)
def _cache_dir(explicit: str | None, xdg_cache_home: str | None, _home: str | None) -> Path:
    if explicit:
        return Path(explicit)
    return Path(xdg_cache_home or Path.home() / ".cache") / "tvm_ops"


_FALLBACK = Path(tempfile.gettempdir()) / f"tvm_ops-cache-{os.getuid()}"


def _own_private(folder: Path) -> bool:
    """Whether `folder` is a directory of this user's that no other user can write: the
    fallback's name in the shared temporary directory is predictable, so another user could
    make it first and put libraries there for this one's calls to load."""
    try:
        info = folder.lstat()
    except OSError:
        return False
    return folder.is_dir() and not folder.is_symlink() and info.st_uid == os.getuid() and not info.st_mode & 0o022


def writable_cache_dir() -> Path:
    """Where a new library is built: the cache directory, or, when it cannot be written, a
    folder in the system's temporary directory (with a warning, once per cache directory)."""
    return _writable(cache_dir())


@functools.lru_cache(maxsize=8)
def _writable(cache: Path) -> Path:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=cache).close()
        return cache
    except OSError as exc:
        fallback = _FALLBACK
        log.warning("the cache directory %s cannot be written (%s); building into %s instead "
                    "(set TVM_OPS_CACHE_DIR to choose another)", cache, exc.strerror or exc, fallback)
        fallback.mkdir(mode=0o700, exist_ok=True)
        if not _own_private(fallback):
            from .errors import ExecutionFailedError

            raise ExecutionFailedError(f"the cache directory {cache} cannot be written, and the fallback {fallback} "
                                       f"is not a folder of this user's that only it can write; set "
                                       f"TVM_OPS_CACHE_DIR to a writable folder") from exc
        return fallback


def search_dirs() -> list[Path]:
    """Build directories to load from, in order: $TVM_OPS_BUILD_DIR (from `build --out`), the
    cache, and the fallback folder where libraries go when the cache cannot be written (only
    if it is this user's alone)."""
    dirs = [Path(os.environ["TVM_OPS_BUILD_DIR"])] if os.environ.get("TVM_OPS_BUILD_DIR") else []
    return dirs + [cache_dir()] + ([_FALLBACK] if _own_private(_FALLBACK) else [])


def records_path() -> Path:
    """The tuning records: $TVM_OPS_RECORDS, else tuning.jsonl in the cache directory."""
    return _records_path(os.environ.get("TVM_OPS_RECORDS"), cache_dir())


@functools.lru_cache(maxsize=8)
def _records_path(explicit: str | None, cache: Path) -> Path:
    return Path(explicit) if explicit else cache / "tuning.jsonl"
