"""Shared fixtures: tiny random Llama engines for the fast suite, the embedded model for integration tests.

torch is imported inside the fixtures, never here: pure tests (configs, schedules, traces, figures) then
run without paying for it.
"""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# One thread: these models are tiny, and on a shared 2-core machine OpenMP threads fight each other. Set in the
# environment, before any test module imports torch, which reads it once at import (subprocesses inherit it).
os.environ["OMP_NUM_THREADS"] = "1"

# Whatever the code under test writes to "the temporary folder" (exports, Gradio's file cache, torch's and
# accelerate's scratch, the same in every subprocess, which inherit the environment) lands in one folder inside
# pytest's own temporary area, removed when the run ends: nothing is left behind in the shared /tmp. Set here, at
# import, because gradio reads its cache folder when test modules import it, before any fixture runs. Modules
# that use the exports_in_tmp fixture narrow this to a folder of their own.
# Test workers (pytest-xdist) inherit TMPDIR from the controller: they make their folder beside its, not inside it, so
# paths stay short (Chromium refuses a profile whose socket path passes about 100 characters).
ROOT_TMP = os.environ.setdefault("D3_TESTS_TMP_ROOT", tempfile.gettempdir())
SCRATCH = Path(ROOT_TMP) / f"pytest-of-{getpass.getuser()}"
SCRATCH.mkdir(mode=0o700, exist_ok=True)
SCRATCH = Path(tempfile.mkdtemp(prefix="d3-scratch-", dir=SCRATCH))
os.environ.update(TMPDIR=str(SCRATCH), GRADIO_TEMP_DIR=str(SCRATCH / "gradio"), D3_CALIBRATION_DIR=str(SCRATCH / "calibration"))
tempfile.tempdir = str(SCRATCH)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SCRATCH, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_tok():
    from tests.tiny import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model():
    from tests.tiny import tiny_llama

    return tiny_llama(num_layers=6)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model, tiny_tok):
    from d3.engine import Engine

    return Engine(tiny_model, tiny_tok, name="tiny")


@pytest.fixture(scope="session")
def tiny_gemma(tiny_tok):
    """A random 6-layer Gemma 3 (tests.tiny.GEMMA_TYPES: global layers 1 and 4 among sliding ones)."""
    from d3.engine import Engine
    from tests.tiny import tiny_gemma3

    return Engine(tiny_gemma3(), tiny_tok, name="tiny-gemma")


@pytest.fixture(scope="session")
def smol_engine():
    """The embedded SmolLM2-135M-Instruct (30 layers), loaded once per session from the local cache."""
    from d3.engine import Engine
    from d3.models import get_model

    return Engine.from_loaded(get_model("smollm2-135m"))


@pytest.fixture()
def unpaced(monkeypatch):
    """Every streamed update of a run goes to the page, as tests that act on token k need (the page paces a fast
    model's updates for the browser: explorer.live.PANES_EVERY_S and FIGURES_EVERY_S)."""
    from explorer import live

    monkeypatch.setattr(live, "PANES_EVERY_S", 0.0)
    monkeypatch.setattr(live, "FIGURES_EVERY_S", 0.0)


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's), one per test module; skipped where it or playwright is missing."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                              "--disable-background-networking"])
        yield b
        b.close()


# ---------------------------------------------------------------- the page on the tiny model


@pytest.fixture(scope="module")
def pool(tiny_engine):
    """The page's model pool over the tiny engine (named "tiny")."""
    from explorer.caps import Caps
    from explorer.pool import ModelPool
    from tests.apphelpers import tiny_factory

    return ModelPool(tiny_factory(tiny_engine), names=("tiny",), caps=Caps(max_new_tokens=64))


@pytest.fixture(scope="module")
def finished(pool):
    """One finished run (views and exports only read it)."""
    from explorer.session import Session
    from tests.apphelpers import run

    session = Session()
    run(pool, session, max_new_tokens=6)
    return session


@pytest.fixture(scope="module")
def engine(request):
    """The one `engine` fixture: a tiny random Llama behind an `Engine` that counts its decode steps (and can be
    slowed down: `engine.delay`), one per test module, so a module may change it (a delay, a counter) without
    touching another's. Its layers: the module's `ENGINE_LAYERS` (default 6; the page's modules use 30, SmolLM2's
    count, so that the page's default core 3 + 3 and calibrated orders fit)."""
    from tests.apphelpers import CountingEngine
    from tests.tiny import tiny_llama, tiny_tokenizer

    return CountingEngine(tiny_llama(getattr(request.module, "ENGINE_LAYERS", 6)), tiny_tokenizer(), name="tiny")


@pytest.fixture(scope="module")
def demo(engine):
    """The page over `engine` (named "tiny"), not served."""
    from explorer import page
    from explorer.caps import Caps

    return page.build_demo(lambda name: engine, model_names=("tiny",), public=False, caps=Caps(max_new_tokens=64))


@pytest.fixture(scope="module")
def url(demo):
    """The page (`demo`) served on a free loopback port, closed after the module."""
    from tests.apphelpers import serve

    with serve(demo) as address:
        yield address


@pytest.fixture()
def page(browser, url, request):
    """A fresh tab on the served page (`url`), at the viewport the test is parametrized with (else desktop)."""
    from tests.pagehelpers import DESKTOP, TIMEOUT_MS

    pg = browser.new_page(viewport=getattr(request, "param", DESKTOP))
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(url)
    pg.wait_for_selector("#generate")
    pg.wait_for_selector("#status", state="attached")  # gradio renders the blocks one by one: the page is whole
    yield pg
    pg.close()


@pytest.fixture(scope="module")
def exports_in_tmp(tmp_path_factory) -> Iterator[Path]:
    """Every export, Gradio's file cache and gradio_client's downloads go into this module's tmp dir, never into
    the shared temporary folder (a module asks for it with
    `pytestmark = pytest.mark.usefixtures("exports_in_tmp")`); the exports inside
    Gradio's cache, as they are served, and the server's export rate counted afresh for the module."""
    from collections import deque

    from explorer import export

    root = tmp_path_factory.mktemp("page-files")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export, "EXPORT_ROOT", root / "gradio" / "d3-exports")
        patch.setattr(export, "_SERVER_EXPORTS", deque())
        patch.setenv("GRADIO_TEMP_DIR", str(root / "gradio"))
        yield root


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, above all on a machine shared with other work."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def chunked_model(tmp_path, monkeypatch):
    """A known model "chunked-tiny" whose GGUF is three chunk packages installed in tmp_path (seen by this process
    and its subprocesses), converted by `d3.testing.gated_conversion` into a cache under tmp_path. Returns
    (its ChunkedGGUF, the folder of the packages)."""
    import hashlib
    import random

    from d3 import models
    from d3.gguf_sources import ChunkedGGUF
    from d3.models import KnownModel, ModelFacts

    site = tmp_path / "site"
    prefix = "d3fake" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:8]  # unique: no import cache hits
    rng = random.Random(0)
    chunks = [rng.randbytes(4096), rng.randbytes(4096), rng.randbytes(1000)]
    for i, data in enumerate(chunks, start=1):
        folder = site / f"{prefix}_part{i}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{i:02d}.bin").write_bytes(data)
    source = ChunkedGGUF(filename="tiny.gguf", distribution=prefix + "-part{i}", module=prefix + "_part{i}",
                         chunk="data/part{i:02d}.bin", version="0.1.0", parts=3, chunk_size=4096,
                         size=sum(map(len, chunks)), sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
                         digests=tuple(hashlib.sha256(c).hexdigest() for c in chunks), install="d3 install chunked-tiny")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    known = KnownModel("a tiny random Llama from three chunk packages", ModelFacts(4, 4, True), source,
                       "d3 install chunked-tiny", converter="d3.testing:gated_conversion")
    monkeypatch.setitem(models.KNOWN_MODELS, "chunked-tiny", known)
    return source, site


# ---------------------------------------------------------------- how the suite spreads over the workers


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With `--dist loadgroup` (pytest.ini), each test module is one group, kept on one worker so its served page
    and models are built once, except a module that sets XDIST_SPLIT = n: its tests are dealt round-robin into n
    groups (its module fixtures are then built once per group), and modules that set the same XDIST_GROUP share one
    group (the modules that load the 28-layer model in float32, about 9 GB each: one worker at a time holds it).
    Modules that drive the browser go first, then the slow ones, so the longest groups do not start last (the order
    within a module is kept)."""
    def rank(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("browser") else 1 if item.get_closest_marker("slow") else 2

    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(modules, key=lambda m: min(rank(i) for i in modules[m]))
    for name in order:
        module = getattr(modules[name][0], "module", None)
        split, group = getattr(module, "XDIST_SPLIT", 1), getattr(module, "XDIST_GROUP", name)
        for k, item in enumerate(modules[name]):
            item.add_marker(pytest.mark.xdist_group(f"{group}#{k % split}" if split > 1 else group))
    items[:] = [item for name in order for item in modules[name]]
