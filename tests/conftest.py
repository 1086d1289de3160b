from __future__ import annotations

from typing import Any

import pytest
import torch

from framework.model_loader import TinySpec, load_model


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """(model, tokenizer): a random 2-layer Llama with SmolLM2's tokenizer."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    return load_model("tiny", None, None, torch.float32, torch.device("cpu"), TinySpec())


@pytest.fixture(scope="session")
def smollm2() -> tuple[Any, Any]:
    return load_model("smollm2", None, None, torch.float32, torch.device("cpu"))
