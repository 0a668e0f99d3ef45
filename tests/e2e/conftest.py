import gc
import threading
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for these tiny models.

    On a shared 2-core machine, OpenMP worker threads spin while other processes hold the
    cores, and the same suite takes 5 s or 2 minutes depending on the neighbours. The models
    here are far too small to gain from a second thread. Restored afterwards.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def no_data_plane_threads_left() -> Iterator[None]:
    """An offloader a test dropped stops its threads when collected (``weakref.finalize``);
    one caught in a reference cycle is collected here, so later suites that count the data
    plane's threads start clean."""
    yield
    if any(t.name.startswith("kvtier-") for t in threading.enumerate()):
        gc.collect()
