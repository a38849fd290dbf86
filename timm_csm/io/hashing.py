"""A reader that hashes what it reads: a file parsed and digested in one read."""
from __future__ import annotations

import hashlib

__all__ = ["HashingReader", "file_sha256"]


class HashingReader:
    """A binary file's reader that feeds every byte it hands out to a SHA-256, so that a parser (``pickle``) reads a
    file and its digest is taken in the same single read. ``read``, ``readinto`` and ``readline`` as the file's."""

    def __init__(self, f):
        self._f, self._hash = f, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._hash.update(data)
        return data

    def readinto(self, buffer) -> int:
        n = self._f.readinto(buffer)
        self._hash.update(memoryview(buffer)[:n])
        return n

    def readline(self, size: int = -1) -> bytes:
        data = self._f.readline(size)
        self._hash.update(data)
        return data

    def hexdigest(self) -> str:
        """The SHA-256 (hex) of the whole file: what was not read yet is read (and hashed) first."""
        while self.read(1 << 20):
            pass
        return self._hash.hexdigest()


def file_sha256(path) -> str:
    """The SHA-256 (hex) of a file, read in 1 MiB chunks."""
    with open(path, "rb") as f:
        return HashingReader(f).hexdigest()
