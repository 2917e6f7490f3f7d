"""Shared fixtures: small models and a fresh Dynamo state per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

# Plans must not depend on how fast this machine happens to be today.
os.environ.setdefault("TENSORTORRENT_PROFILE", "nominal")
# Each test searches; the plan cache has tests of its own.
os.environ.setdefault("TENSORTORRENT_PLAN_CACHE", "0")

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
