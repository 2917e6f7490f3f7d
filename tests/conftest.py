"""Shared fixtures: small models and a fresh Dynamo state per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tensortorrent_dynamo import tensortorrent_backend


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    tensortorrent_backend.reset()
    yield
    torch._dynamo.reset()
    tensortorrent_backend.reset()
