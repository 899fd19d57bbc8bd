from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
# pytester's in-process runs drop the modules first imported inside them, and numpy's FFT extension
# (which scipy.special pulls in) refuses to load twice in one process: import it once, here.
import scipy.special  # noqa: F401

HERE = Path(__file__).resolve().parent
# Support modules (helpers, fake_worker, gpu_support, ...) import by name from every folder, and so do the
# few test modules another test reuses: pytest's default import mode needs unique test basenames anyway.
sys.path[:0] = [str(HERE), *sorted(str(d) for d in HERE.iterdir() if d.is_dir() and next(d.glob("test_*.py"), None))]

from gpu_support import gpu_problem, gpu_required  # noqa: E402
from helpers import write_suite  # noqa: E402

SAMPLED_IN_FAST_RUN = 8  # the fast run cross-checks one accepted document in this many per schema

_NO_GPU = pytest.StashKey[str]()


def pytest_addoption(parser):
    parser.addoption("--require-gpu", action="store_true", dest="require_gpu",
                     help="gpu-marked tests fail, naming the underlying error, where they would skip for want of "
                          "a GPU (also CUDAGATE_REQUIRE_GPU=1); for the GPU machine")


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests skip cleanly without a CUDA device, saying why; on a machine that must have
    one (``--require-gpu``, CUDAGATE_REQUIRE_GPU=1) they fail with the underlying error instead."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    problem = gpu_problem() if gpu_items else None
    if problem is None:
        return
    if gpu_required(config):
        config.stash[_NO_GPU] = problem
    else:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"no CUDA device ({problem})"))


@pytest.hookimpl(tryfirst=True)  # before fixtures: a module's GPU fixture would otherwise hit the error first
def pytest_runtest_setup(item):
    problem = item.config.stash.get(_NO_GPU, None)
    if problem is not None and "gpu" in item.keywords:
        pytest.fail(f"a GPU is required here (--require-gpu / CUDAGATE_REQUIRE_GPU) but none is usable: {problem}",
                    pytrace=False)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """The compile and generated-data caches (``$CUDAGATE_CACHE_DIR``) every test of this process shares,
    as a CI runner keeps them between jobs: a kernel compiles once, not once per test. A test about the
    caches themselves sets a folder of its own."""
    return tmp_path_factory.getbasetemp() / "nvrtc-cache"


@pytest.fixture(autouse=True)
def _isolated_compile_cache(shared_cache, monkeypatch):
    """Keep the on-disk caches out of the user's home."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(shared_cache))


@pytest.fixture(autouse=True, scope="session")
def _schema_engines_agree(request):
    """The compiled validator only says "valid" and jsonschema words the refusals: across the documents
    the tests validate, it must never accept one that jsonschema refuses (stricter is harmless). The
    full run (CI) checks every document; the fast run (`-m "not slow"`) the first of each schema's and one
    in eight after it, since jsonschema's walk of the large reports would be a tenth of its time."""
    import pytest_cudagate.boundary.schema as schema

    fast = schema._valid
    every = SAMPLED_IN_FAST_RUN if "not slow" in (request.config.getoption("markexpr") or "") else 1
    accepted_so_far = Counter()

    def checked(document, name):
        accepted = fast(document, name)
        if accepted:
            accepted_so_far[name] += 1
            if (accepted_so_far[name] - 1) % every == 0:
                refused = [e.message[:200] for e in schema._validator(name).iter_errors(document)]
                assert not refused, f"the compiled validator accepted a {name} document jsonschema refuses: {refused}"
        return accepted

    schema._valid = checked
    yield
    schema._valid = fast


@pytest.fixture
def suite_path(tmp_path) -> Path:
    """A valid ``scale`` suite with generated case data, in its own folder."""
    return write_suite(tmp_path / "scale")
