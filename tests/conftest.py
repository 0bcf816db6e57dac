import pytest
import torch

from lp.models import tiny_random_llama


@pytest.fixture(scope="session")
def tiny_model64():
    """A seeded random Llama in float64 (exactness tests)."""
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return tiny_random_llama(vocab=64, seed=0).model.double()
