"""The conversion cache: each embedded model converted once into <root>/<name>/<key>, checked before every load."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CACHE_ENV = "D3_CACHE_DIR"
CACHE_VERSION = 1  # bump to invalidate every converted model when the conversion changes
MARKER = "d3-source.json"  # written last: a folder without it was never finished
TEMP_PREFIX = ".tmp-"
# A conversion takes one to two minutes here; a temp folder untouched for this long belongs to a crashed one.
STALE_AFTER_S = 30 * 60
# The marker's "covers": what its records cover. Older code recorded only the weights (no key): a load records the
# other files as they are then; a marker that covers every file makes a file added later damage.
COVERS, EVERY_FILE = "covers", "every file"
ENDS_BYTES = 1 << 20  # hashing the first and last MiB takes ~2 ms; a full sha256 of the 538 MB file takes 1-3 s

Convert = Callable[[Path, Path, str], None]  # (gguf file, output folder, model name): writes a save_pretrained folder


def cache_root() -> Path:
    """Where converted models live: $D3_CACHE_DIR, else ~/.cache/d3-explorer."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "d3-explorer").expanduser()


def ready_conversion(name: str, key: str) -> Path | None:
    """<cache_root>/<name>/<key> when a finished conversion is there and its weights match their record, else None
    (nothing is converted or removed: `cached_conversion` does that)."""
    final = cache_root() / name / key
    if (final / MARKER).is_file() and check_folder(final) is None:
        return final
    return None


def cached_conversion(name: str, key: str, make_gguf: Callable[[Path], Path], convert: Convert) -> Path:
    """<cache_root>/<name>/<key>, converting first when it is missing or damaged (written to a temp dir, renamed)."""
    final = cache_root() / name / key
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final.parent)
    if (final / MARKER).is_file():
        problem = check_folder(final)
        if problem is None:
            return final
        log.warning("the cached %s is damaged (%s): converting it again", name, problem)
        _discard(final, key)
    work = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{key}-{os.getpid()}-", dir=final.parent))
    try:
        gguf = make_gguf(work)
        convert(gguf, work / "model", name)
        _write_marker(work / "model", {"name": name, "gguf": gguf.name, "cache_version": CACHE_VERSION})
        _publish(work / "model", final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


# ---------------------------------------------------------------- checking a finished folder


def weight_record(path: Path) -> dict[str, Any]:
    """Size and sha256 of the first and last MiB: a cheap first look that catches a truncated file."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(ENDS_BYTES))
        handle.seek(max(0, size - ENDS_BYTES))
        digest.update(handle.read(ENDS_BYTES))
    return {"size": size, "sha256_ends": digest.hexdigest()}


def full_digest(path: Path) -> dict[str, Any]:
    """The sha256 of the whole file (1-3 s for SmolLM2's 538 MB on a shared 2-core machine:
    scripts/bench_hardening.py) and the modification time it was taken at: any changed byte changes it, a
    stretch overwritten in the middle included."""
    mtime_ns = path.stat().st_mtime_ns
    with path.open("rb") as handle:
        return {"mtime_ns": mtime_ns, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}


def check_folder(folder: Path) -> str | None:
    """None if every file of the folder matches the marker's record; otherwise what is wrong, in a few words.

    Every file a load reads is recorded (the weights, config.json, the tokenizer's files, the chat template, the
    generation config): a changed layer count or rope_theta is damage like a changed weight. Each file's size
    and ends are checked at every load (~2 ms). Its full sha256 (kept beside, under "digests", where markers
    written by older code leave it alone) is checked only when the file's modification time is not the one
    recorded with it: the full hash runs once per change of the file, not once per load. A file that was not
    there at conversion is damage too (a chat template dropped in changes every prompt)."""
    try:
        meta = json.loads((folder / MARKER).read_text())
        files = meta.get("files")
        digests = dict(meta.get("digests") or {})
    except (OSError, ValueError, AttributeError, TypeError):
        return f"{MARKER} is unreadable"
    if files is None:  # a marker from before records were kept: check the structure, then record what is there
        problem = _check_structure(folder)
        if problem is None:
            _upgrade_marker(folder, meta)
        return problem
    if not files or not isinstance(files, dict):
        return "no weight files recorded"
    malformed = next((f for f, r in files.items() if not _is_record(f, r)), None)
    if malformed is not None:  # a record of the wrong type or shape: damaged like a wrong file, never a TypeError
        return f"the record of {str(malformed)[:80]!r} in {MARKER} is malformed"
    for filename, expected in files.items():
        path = folder / filename
        if not path.is_file():
            return f"{filename} is missing"
        if weight_record(path) != expected:
            actual = path.stat().st_size
            return f"{filename} is {actual:,} bytes, {expected['size']:,} expected" if actual != expected["size"] \
                else f"{filename} differs from the recorded hash"
    problem, checked = _check_digests(folder, files, digests)
    if problem is not None:
        return problem
    unrecorded = [name for name in _recorded_names(folder) if name not in files]
    if unrecorded and meta.get(COVERS) == EVERY_FILE:
        return f"{unrecorded[0]} was not there at conversion"
    upgrade = checked != digests
    if meta.get(COVERS) != EVERY_FILE:  # a marker from older code recorded only the weights: record the rest now
        files = {**files, **{name: weight_record(folder / name) for name in unrecorded}}
        checked = {**checked, **{name: full_digest(folder / name) for name in unrecorded}}
        upgrade = True
    if upgrade:
        _upgrade_marker(folder, meta, files, checked)
    return None


def _is_record(filename: Any, record: Any) -> bool:
    """A weight file's record as `weight_record` writes it: a safe file name, an int size, a hex digest."""
    return (isinstance(filename, str) and filename == Path(filename).name and filename not in ("", ".", "..")
            and isinstance(record, dict) and type(record.get("size")) is int and record["size"] >= 0
            and isinstance(record.get("sha256_ends"), str))


def verify_folder(folder: Path) -> str | None:
    """Every file of the folder (weights, config, tokenizer, chat template) hashed in full against the sha256
    recorded at conversion, whatever its modification time says (on demand: `d3 install NAME --verify`; seconds
    per GB). None when all match; else what differs."""
    problem = check_folder(folder)
    if problem is not None:
        return problem
    meta = json.loads((folder / MARKER).read_text())
    if meta.get(COVERS) != EVERY_FILE:  # older code's marker, in a cache this process may not write
        return (f"{MARKER} records only the weights (written by older code): load the model once where the cache is "
                "writable to record the other files")
    digests = meta.get("digests") if isinstance(meta.get("digests"), dict) else {}
    for filename in sorted(meta.get("files") or _weight_names(folder)):
        recorded = digests.get(filename)
        if not isinstance(recorded, dict):
            return f"no sha256 of {filename} was recorded at conversion (a marker from older code, read-only)"
        if full_digest(folder / filename)["sha256"] != recorded.get("sha256"):
            return f"{filename} differs from the sha256 recorded at conversion (its bytes were changed)"
    return None


def _weight_names(folder: Path) -> list[str]:
    return [p.name for p in folder.glob("*.safetensors")]


def _recorded_names(folder: Path) -> list[str]:
    """The files a marker records: every file at the folder's top level but the marker (and its staged copies)."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(MARKER))


def _check_digests(folder: Path, files: dict[str, Any], digests: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(what is wrong or None, the digests to record): a file without a digest (a marker from older code) gets
    one now."""
    checked = {}
    for filename in files:
        path, recorded = folder / filename, digests.get(filename)
        if isinstance(recorded, dict) and recorded.get("mtime_ns") == path.stat().st_mtime_ns:
            checked[filename] = recorded
            continue
        now = full_digest(path)
        if isinstance(recorded, dict) and now["sha256"] != recorded.get("sha256"):
            return f"{filename} differs from the sha256 recorded at conversion (its bytes were changed)", digests
        checked[filename] = now
    return None, checked


def _check_structure(folder: Path) -> str | None:
    """The safetensors headers parse and cover each file exactly (a truncated file fails to open)."""
    from safetensors import SafetensorError, safe_open

    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "no weight files"
    for path in weights:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            return f"{path.name} does not open ({err})"
    return None


def _upgrade_marker(folder: Path, meta: dict[str, Any], files: dict[str, Any] | None = None,
                    digests: dict[str, Any] | None = None) -> None:
    try:
        _write_marker(folder, meta, files, digests)
    except OSError as err:  # a read-only cache still loads; it is only checked less closely
        log.info("could not record the weight files in %s (%s)", folder / MARKER, err)


def _write_marker(folder: Path, meta: dict[str, Any], files: dict[str, Any] | None = None,
                  digests: dict[str, Any] | None = None) -> None:
    """The marker with a record and a full digest of every file of the folder (`files`, `digests`, else made now),
    replaced atomically (another process may be reading it)."""
    names = _recorded_names(folder)
    files = files if files is not None else {name: weight_record(folder / name) for name in names}
    digests = digests if digests is not None else {name: full_digest(folder / name) for name in names}
    staged = folder / f"{MARKER}.{os.getpid()}.{threading.get_ident()}.tmp"
    staged.write_text(json.dumps({**meta, COVERS: EVERY_FILE, "files": files, "digests": digests}))
    os.replace(staged, folder / MARKER)


# ---------------------------------------------------------------- temp folders and races

_TEMP_PID = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]+-(\d+)-")


def remove_stale_temps(folder: Path, *, now: float | None = None) -> list[Path]:
    """Delete temp folders left by crashed conversions: their process is gone, or nothing changed for a long time."""
    now = time.time() if now is None else now
    removed = []
    for entry in folder.glob(TEMP_PREFIX + "*"):
        match = _TEMP_PID.match(entry.name)
        dead = match is not None and not _process_alive(int(match.group(1)))
        if entry.is_dir() and (dead or now - _newest_mtime(entry) > STALE_AFTER_S):
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed %s, left by an unfinished conversion", entry)
            removed.append(entry)
    return removed


def _process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (the cache is per machine, like the pids)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def _newest_mtime(folder: Path) -> float:
    newest = folder.stat().st_mtime
    for root, dirs, files in os.walk(folder):
        for item in (*dirs, *files):
            try:
                newest = max(newest, os.stat(os.path.join(root, item)).st_mtime)
            except FileNotFoundError:  # deleted while we looked
                continue
    return newest


def _discard(final: Path, key: str) -> None:
    """Move a damaged folder out of the way first (atomic), so no other process picks it up, then delete it."""
    doomed = final.parent / f"{TEMP_PREFIX}{key}-{os.getpid()}-damaged-{time.time_ns()}"
    try:
        final.rename(doomed)
    except FileNotFoundError:  # another process got there first
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _publish(staged: Path, final: Path) -> None:
    """Rename into place; if another process won the race, keep theirs (rename fails on a non-empty dir)."""
    try:
        staged.rename(final)
    except OSError:
        if not (final / MARKER).is_file():
            raise
