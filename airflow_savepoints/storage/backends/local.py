"""Local disks: plain ``os`` calls where they are cheaper or safer than fsspec's.

Writes are a temporary file renamed into place (fsync'ed first); exclusive create is a temporary
file hard-linked as the name (``link`` fails if the name exists); copies are hard links where the
filesystem allows them; a read pins the inode it opened. Listings read the names with one
``scandir`` per folder and stat a file when it is first looked up (or many at once: ``stats_of``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, ClassVar

from airflow_savepoints.storage.backends.base import LINK, STREAM, Backend, FileStat, OnError, OnPage, TooLarge, WrongKind
from airflow_savepoints.storage.backends.generic import temporary_name

# errnos of a link the filesystem refuses (another device, no hard links, not allowed): copy instead
NO_LINK_ERRNOS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EACCES}

# Threads for the loops of system calls a savepoint makes by the hundred (``mkdir``, ``link``): each call releases
# the GIL, so where this process may run on several cores the kernel's work spreads over them (on one core,
# threads only add switches: none then)
SYSCALL_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
MIN_FOLDERS_PER_THREAD = 64  # a mkdir on ext4 costs tens of microseconds, a thread's start about a hundred
MIN_LINKS_PER_THREAD = 256


def in_slices(loop: Callable[[list], list], items: list, min_each: int) -> list:
    """``loop(items)``, run over contiguous slices of at least ``min_each`` items in up to ``SYSCALL_THREADS``
    threads (this one takes the first), the results joined in order. The first failure (in slice order) is raised."""
    count = min(SYSCALL_THREADS, len(items) // min_each)
    if count <= 1:
        return loop(items)
    size = -(-len(items) // count)
    slices = [items[start:start + size] for start in range(0, len(items), size)]
    with ThreadPoolExecutor(len(slices) - 1, thread_name_prefix="syscalls") as pool:
        rest = [pool.submit(loop, part) for part in slices[1:]]
        found = loop(slices[0])
        for future in rest:
            found += future.result()
    return found


def local_version(st: os.stat_result) -> str:
    """The version token of a local file from its stat: ``version_token`` of fsspec's entry for it
    (inode, then mtime; written out because listings call it once per file)."""
    return f"{st.st_ino}:{st.st_mtime}"


def local_file_stat(st: os.stat_result) -> FileStat:
    """A local file's listing entry from its stat."""
    return FileStat(st.st_size, local_version(st), st.st_mtime)  # positional: one per planned file


class LocalBackend(Backend):
    """This machine's filesystems (``file://`` and plain absolute paths)."""

    local: ClassVar[bool] = True
    poll_interval: ClassVar[float] = 0.1

    @classmethod
    def filesystem_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        return {"auto_mkdir": True, **options}

    @property
    def is_local_disk(self) -> bool:
        return type(self.fs).__name__ == "LocalFileSystem"  # not wrapped (a cache, a test's counter)

    def url(self, scheme: str, path: str) -> str:
        return path

    def spark_url(self, scheme: str, path: str) -> str:
        return f"file:{path}"

    def strip(self, path: str) -> str:
        return path

    def real_path(self, path: str) -> str:
        return os.path.realpath(path)

    # --- reading -----------------------------------------------------------------------------------
    def list_files(self, base: str) -> dict[str, FileStat]:
        if not self.is_local_disk:
            return super().list_files(base)
        return LazyLocalListing(base, scan_names(base), _raise).present()

    def list_files_lazily(self, base: str, on_error: OnError, links: list[str] | None = None,
                          on_page: OnPage | None = None) -> Mapping[str, FileStat]:
        if not self.is_local_disk:
            if links is not None:
                scan_names(base, links)
            return super().list_files(base)
        folders: dict[str, list[str]] = {}
        inodes: dict[str, int] = {}
        return LazyLocalListing(base, scan_names(base, links, folders, inodes), on_error, folders, inodes)

    def stat_files(self, base: str, paths: Iterable[str], on_error: OnError) -> dict[str, FileStat]:
        """One stat per file (cheaper than listing every version Spark keeps)."""
        if not self.is_local_disk:
            return super().stat_files(base, paths, on_error)
        return LazyLocalListing(base, list(paths), on_error).present()

    def symlinks(self, path: str, limit: int) -> list[str]:
        links: list[str] = []
        scan_names(path, links)
        return sorted(links)[:limit]

    def symlink_target(self, path: str) -> str | None:
        return os.readlink(path) if os.path.islink(path) else None

    def read_bytes(self, path: str) -> bytes:
        if not self.is_local_disk:
            return super().read_bytes(path)
        with open(path, "rb") as handle:  # a planner reads dozens of small files: no fsspec file object each
            return handle.read()

    def read_stamped(self, path: str) -> tuple[bytes, float | None]:
        with open(path, "rb") as handle:  # the time of exactly the file read
            return handle.read(), os.fstat(handle.fileno()).st_mtime

    def read_capped(self, path: str, cap: int) -> tuple[bytes, float | None]:
        """The final name opened without following a link (``O_NOFOLLOW``) nor waiting for a FIFO's
        writer (``O_NONBLOCK``), then ``fstat``: a regular file of at most ``cap`` bytes is read."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise WrongKind("a symbolic link") from exc
            if exc.errno == errno.ENXIO:  # a socket
                raise WrongKind("a socket") from exc
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise WrongKind(_kind_of(st.st_mode))
            if st.st_size > cap:
                raise TooLarge(st.st_size)
            chunks, left = [], cap + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            if len(data) > cap:  # grew since the fstat
                raise TooLarge(len(data))
            return data, st.st_mtime
        finally:
            os.close(fd)

    def open_read(self, path: str, block_size: int | None) -> tuple[IO[bytes], str | None]:
        handle = open(path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it
        return handle, local_version(os.fstat(handle.fileno()))  # the inode read, whatever Spark renames

    # --- writing -----------------------------------------------------------------------------------
    def open_write(self, path: str) -> IO[bytes]:
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        return open(path, "wb")  # noqa: SIM115 - the caller closes it

    def make_parents(self, paths: Iterable[str]) -> None:
        """Sorted, a folder comes after its parent: one ``mkdir`` each, ``makedirs`` only for a missing parent
        (in slices, ``in_slices``: a slice's first folders may wait for a parent another thread makes)."""
        in_slices(_make_folders, sorted({posixpath.dirname(p) for p in paths}), MIN_FOLDERS_PER_THREAD)

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = temporary_name(path)
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """A temporary file hard-linked as ``path``; a filesystem without links: ``O_EXCL``, then write."""
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = temporary_name(path)
        with open(tmp, "wb") as handle:  # no fsync: after a crash a lease is judged by its mtime
            handle.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in NO_LINK_ERRNOS:
                raise
            return _create_without_link(path, data)
        finally:
            os.unlink(tmp)
        return True

    def touch(self, path: str) -> None:
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        with open(path, "wb"):
            pass

    # --- copying -----------------------------------------------------------------------------------
    def copy_methods(self, source: Backend) -> tuple[str, ...]:
        return (LINK, STREAM) if isinstance(source, LocalBackend) else (STREAM,)

    def link(self, source: str, target: str, *, parent_ready: bool) -> FileStat | None:
        """Spark never edits a checkpoint file in place and this tool never edits a savepoint file, so
        a link is an independent copy: replacing or purging the original only removes its own name."""
        if not parent_ready:
            os.makedirs(posixpath.dirname(target), exist_ok=True)
        try:
            os.link(source, target, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in NO_LINK_ERRNOS:  # a missing source or an existing target raise
                return None
            raise
        return local_file_stat(os.stat(target))

    def link_checked(self, pairs: list[tuple[str, str]], listed: list[FileStat | None]) -> list[tuple[int, bool] | None]:
        """Tight loops (a savepoint links hundreds of files; in slices, ``in_slices``): a link and a stat of the
        linked inode each, its size and whether it is the version ``listed`` for the pair (the same inode and
        modification time as its token, ``local_version``; compared as numbers: formatting a float is most of a
        token's cost)."""
        return in_slices(_link_checked, list(zip(pairs, listed, strict=True)), MIN_LINKS_PER_THREAD)

    def link_and_read(self, pairs: list[tuple[str, str]], extend: Callable[[int, bytes], int],
                      chunk: int) -> list[tuple[int, int, str] | None]:
        """Hard-link each ``(source, target)`` (the targets' folders exist) and read the linked inode once,
        ``chunk`` bytes at a time, into ``extend(value, bytes)`` (a checksum): its size, the checksum and the
        version token of the inode read (``fstat``), in one tight loop. None where links are refused; a
        missing source raises FileNotFoundError, an existing target FileExistsError."""
        found: list[tuple[int, int, str] | None] = []
        link, open_, fstat, read, close, append = os.link, os.open, os.fstat, os.read, os.close, found.append
        flags = os.O_RDONLY | os.O_CLOEXEC
        for source, target in pairs:
            try:
                link(source, target, follow_symlinks=False)
            except (FileNotFoundError, FileExistsError):
                raise
            except OSError as exc:
                if exc.errno not in NO_LINK_ERRNOS:
                    raise
                append(None)
                continue
            fd = open_(target, flags)
            try:
                st, value, size = fstat(fd), 0, 0
                while data := read(fd, chunk):
                    value = extend(value, data)
                    size += len(data)
            finally:
                close(fd)
            append((size, value, local_version(st)))
        return found

    # --- deleting ----------------------------------------------------------------------------------
    def remove_empty_folders(self, paths: Iterable[str]) -> None:
        for folder in sorted(set(paths), key=lambda f: -f.count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def _make_folders(folders: list[str]) -> list[str]:
    for folder in folders:
        try:
            os.mkdir(folder)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
    return []


def _link_checked(jobs: list[tuple[tuple[str, str], FileStat | None]]) -> list[tuple[int, bool] | None]:
    found: list[tuple[int, bool] | None] = []
    link, stat, append = os.link, os.stat, found.append
    for (source, target), entry in jobs:
        try:
            link(source, target, follow_symlinks=False)
        except FileNotFoundError:
            append(None)
        except OSError as exc:
            if exc.errno not in NO_LINK_ERRNOS:  # an existing target raises
                raise
            append(None)
        else:
            st = stat(target)
            append((st.st_size, entry is not None and entry.modified == st.st_mtime
                    and entry.version.startswith(f"{st.st_ino}:")))
    return found


def _kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _raise(exc: OSError, path: str):
    raise exc


def _create_without_link(target: str, data: bytes) -> bool:
    """O_EXCL create, then write: for local filesystems that refuse hard links (readers may see it
    empty for a moment; a lease judges an unreadable file by its mtime, so that is not fatal)."""
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return True


def scan_names(base: str, links: list[str] | None = None, folders: dict[str, list[str]] | None = None,
               inodes: dict[str, int] | None = None) -> list[str]:
    """The files of a local tree, relative to ``base``, with one ``scandir`` per folder (no stat).
    A linked folder is never walked into; symbolic links are also added to ``links`` if given,
    each folder's files (folder -> its files' paths, ``""`` for ``base``) to ``folders`` if given, and
    each file's inode number as the folder read gave it (``DirEntry.inode()``: no system call) to
    ``inodes`` if given."""
    out: list[str] = []
    pending = [(base, "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        files: list[str] = []
        for entry in entries:
            try:  # one type test per file as a rule (the folder's entry says it is a plain file: no stat)
                if entry.is_file(follow_symlinks=False):
                    files.append(name := prefix + entry.name)
                    if inodes is not None:
                        inodes[name] = entry.inode()
                    continue
                is_dir = entry.is_dir(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the folder was read
            if is_dir:
                pending.append((entry.path, prefix + entry.name + "/"))
                continue
            if links is not None and entry.is_symlink():
                links.append(prefix + entry.name)
            files.append(prefix + entry.name)
        if files:
            out += files
            if folders is not None:
                folders[prefix[:-1]] = files
    return out


class LazyLocalListing(Mapping[str, FileStat]):
    """Local file names below ``base``; a file's stat (the same entry and version token fsspec's
    ``find`` gives) is taken when first looked up. A file removed since the scan is missing; any
    other error of the stat goes to ``on_error(exc, path)`` (the store's error translation).
    ``folders``: each folder's files, as the scan found them (``scan_names``), when it kept them;
    ``inodes``: each file's inode number as the folder read gave it, when it kept them.

    ``expect`` takes entries known from elsewhere (a previous savepoint's manifest) as the entries of
    names still holding the same inode: such an entry is not stat'ed, but it is *expected*, not
    measured, until ``confirm`` stats it. Whoever relies on an expected entry proves it (the copier
    compares it with the stat of the inode it linked) or confirms it first."""

    def __init__(self, base: str, names: list[str], on_error: OnError, folders: dict[str, list[str]] | None = None,
                 inodes: dict[str, int] | None = None):
        self._base, self._names = base.rstrip("/") or "", dict.fromkeys(names)
        self._stats: dict[str, FileStat] = {}
        self._expected: set[str] = set()  # names whose entry in ``_stats`` is expected, not yet stat'ed
        self._on_error = on_error
        self.folders = folders
        self._inodes = inodes

    def expect(self, entries: Iterable[tuple[str, int, str]]) -> int:
        """Take each ``(name, size, version)`` (a local version token, ``<inode>:<mtime>``) as the entry of a
        listed name not looked up yet whose inode, as the scan read it, is the token's; returns how many
        were taken. Nothing is taken without the scan's inode numbers."""
        inodes, stats, expected = self._inodes, self._stats, self._expected
        if not inodes:
            return 0
        get_inode = inodes.get
        for rel, size, version in entries:
            inode, _, mtime = version.partition(":")
            if rel not in stats and inode.isdigit() and get_inode(rel) == int(inode):
                try:
                    stats[rel] = FileStat(size, version, float(mtime))
                except ValueError:  # not a local token
                    continue
                expected.add(rel)
        return len(expected)

    def is_expected(self, rel: str) -> bool:
        """Whether ``rel``'s entry was taken by ``expect`` and not stat'ed since."""
        return rel in self._expected

    def confirm(self, rel: str) -> FileStat | None:
        """``rel``'s entry as measured: an expected one is stat'ed now (and replaced by what the stat says)."""
        if rel in self._expected:
            self._expected.discard(rel)
            del self._stats[rel]
        return self.get(rel)

    def __getitem__(self, rel: str) -> FileStat:
        stat = self.get(rel)
        if stat is None:
            raise KeyError(rel)
        return stat

    def get(self, rel: str, default: FileStat | None = None) -> FileStat | None:  # type: ignore[override]
        """``Mapping.get`` without its try/except: the copier asks once per file."""
        stat = self._stats.get(rel)
        if stat is not None:
            return stat
        return self.stats_of((rel,))[0] if rel in self._names else default

    def stats_of(self, rels: Iterable[str]) -> list[FileStat | None]:
        """The entry of each of ``rels`` (None: not listed, or removed since the scan), in one tight
        loop: a planner asks for hundreds at once (the stat taken here: ``local_file_stat``)."""
        found: list[FileStat | None] = []
        append, cached, names, base, stat = found.append, self._stats, self._names, self._base, os.stat
        for rel in rels:
            entry = cached.get(rel)
            if entry is None and rel in names:
                try:
                    st = stat(f"{base}/{rel}")
                except (FileNotFoundError, NotADirectoryError):
                    pass
                except OSError as exc:
                    self._on_error(exc, f"{base}/{rel}")
                else:
                    entry = cached[rel] = FileStat(st.st_size, f"{st.st_ino}:{st.st_mtime}", st.st_mtime)
            append(entry)
        return found

    def present(self) -> dict[str, FileStat]:
        """Every listed file that is still there, stat'ed."""
        return {name: stat for name, stat in zip(self._names, self.stats_of(self._names), strict=True) if stat is not None}

    def __contains__(self, rel: object) -> bool:
        return rel in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
