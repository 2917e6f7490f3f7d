"""A weight used at places far apart in a graph (a layer applied in a loop, a tied
embedding) is streamed for each run of its uses and evicted in between, instead of held
from its first use to its last."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.run import ops
from tests.integration.corpus.harness import (
    DEVICE,
    INFERENCE_CONTEXTS,
    assert_same,
    disk_options,
    param_bytes,
)
from tests.integration.corpus.harness import options as corpus_options

transformers = pytest.importorskip("transformers")

LAYERS = 6


def _albert() -> tuple[torch.nn.Module, torch.Tensor]:
    """ALBERT: one layer's weights shared by all ``LAYERS`` layers."""
    torch.manual_seed(0)
    config = transformers.AlbertConfig(
        vocab_size=256,
        embedding_size=32,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
    )
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    return transformers.AlbertModel(config).eval(), ids


def _run_albert(
    options: Callable[[torch.nn.Module], dict[str, Any]],
) -> tuple[tt.CompiledModule, collections.Counter[str]]:
    """ALBERT compiled with ``options(model)``, checked against eager under both inference
    contexts; with how many stays each streamed weight has, each of the shared layer's
    having one per layer."""
    model, ids = _albert()
    with torch.no_grad():
        expected = model(ids)
    compiled = tt.compile(model, example_inputs=(ids,), **options(model))
    for context in INFERENCE_CONTEXTS:
        with context():
            assert_same(compiled(ids), expected)
    (graph,) = compiled.graphs
    params = graph.plan.cost.params
    stays = collections.Counter(params[stay.param].fqn for stay in graph.plan.stays())
    shared = [fqn for fqn in stays if ".albert_layers.0." in fqn]
    assert shared and all(stays[fqn] == LAYERS for fqn in shared), stays
    return compiled, stays


def test_a_layer_applied_in_a_loop_streams_its_weights_for_each_application() -> None:
    """At three quarters of ALBERT's weights on the device, each weight of the shared layer
    that streams comes in once per layer and leaves after it. Held from its first use to
    its last, the shared layer needed 297 KiB of the 237 KiB budget and was refused."""

    def options(model: torch.nn.Module) -> dict[str, Any]:
        return corpus_options("third", model) | {"budgets": {DEVICE: param_bytes(model) * 3 // 4}}

    compiled, stays = _run_albert(options)
    (graph,) = compiled.graphs
    prefetches = [n for n in graph.module.graph.nodes if n.target is ops.prefetch]
    evictions = [n for n in graph.module.graph.nodes if n.target is ops.evict]
    assert len(prefetches) == len(evictions) == sum(stays.values())
    # one truth for memory: the run holds what the plan counts
    budget = next(d.budget_bytes for d in graph.plan.devices if d.name == DEVICE)
    assert compiled.measured_peaks()[DEVICE] == graph.plan.predicted_peak(DEVICE) <= budget
    comeback = f"{len([n for n in stays.values() if n > 1])} come back after a gap in their uses"
    assert comeback in compiled.explain()


def test_a_shared_layer_read_from_disk_is_read_for_each_application(tmp_path: Path) -> None:
    """With no accelerator and most of the weights on disk, the shared layer's weights that
    stream are read once per layer, each into a buffer freed after its layer."""

    def options(model: torch.nn.Module) -> dict[str, Any]:
        return disk_options(model, tmp_path) | {"budgets": {"cpu": param_bytes(model) * 4 // 5}}

    compiled, stays = _run_albert(options)
    reads = f"{len(stays)} parameters read from disk each run in {sum(stays.values())} reads"
    assert reads in compiled.explain()
