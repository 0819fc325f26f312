"""What ``-f`` names, read as kubectl reads it: files, directories (``-R`` to descend) and stdin,
``-f`` given any number of times, in the order given."""

from __future__ import annotations

import sys
from pathlib import Path

from function.offline.yamldoc import DocumentError

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
"""What ``-f DIR`` reads, as kubectl does."""


def _text(label: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DocumentError(f"{label}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def _directory(path: Path, recursive: bool) -> list[Path]:
    found = path.rglob("*") if recursive else path.iterdir()
    files = sorted(p for p in found if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
    if files:
        return files
    # An empty answer would print nothing and exit 0: say why nothing was read instead.
    suffixes = ", ".join(MANIFEST_SUFFIXES)
    if not recursive and any(p.is_dir() for p in path.iterdir()):
        raise DocumentError(f"{path}: no {suffixes} file here, only subdirectories: add -R to read them")
    raise DocumentError(f"{path}: no {suffixes} file{' in it or below' if recursive else ''}")


def manifest_sources(filenames: list[str], recursive: bool) -> list[tuple[str, str]]:
    """(label, text) of every input, in the order of the ``-f`` options. A file in a directory is
    labelled relative to it when the directory is the only input (as before), else by its path."""
    if filenames.count("-") > 1:
        raise DocumentError("-f -: standard input can be read only once")
    sources: list[tuple[str, str]] = []
    for filename in filenames:
        # Bytes decoded as they are: text mode would turn CRLF into LF, and an untouched document
        # must come out byte for byte.
        if filename == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            sources.append(("-", _text("-", stdin.read()) if stdin is not None else sys.stdin.read()))
            continue
        path = Path(filename)
        if not path.is_dir():
            sources.append((filename, _text(filename, path.read_bytes())))
            continue
        for file in _directory(path, recursive):
            label = str(file.relative_to(path)) if len(filenames) == 1 else str(file)
            sources.append((label, _text(str(file), file.read_bytes())))
    return sources


def several(filenames: list[str]) -> bool:
    """Whether reports name the source of each object: more than one input, or a directory."""
    return len(filenames) > 1 or any(name != "-" and Path(name).is_dir() for name in filenames)
