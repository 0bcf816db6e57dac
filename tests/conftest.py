import pytest
import torch

from lp.models import tiny_random_llama


def pytest_collection_modifyitems(config, items):
    """Slow tests run only when a -m expression asks for them (`pytest -m slow`);
    a bare `pytest` deselects them, like CI's `-m "not slow"`."""
    if config.option.markexpr:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def tiny_model64():
    """A seeded random Llama in float64 (exactness tests)."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return tiny_random_llama(vocab=64, seed=0).model.double()
