"""``generate()`` through the backend with a static KV cache, as people run it: greedy
tokens equal eager's (fp32) with the weights streamed to a virtual device, and with the
weights on disk under a host budget; where the plan keeps the KV cache, in explain()
(expecttest); a cache the budgets cannot hold refused before any token, naming its size
and the largest length that fits."""

from __future__ import annotations

import copy
import re
from typing import Any

import expecttest
import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.plan.planner import resident_set
from tensortorrent_dynamo.report.explain import explain

transformers = pytest.importorskip("transformers")

PROMPT = 6
NEW_TOKENS = 8
VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _model(positions: int = 64) -> Any:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=positions,
    )
    return transformers.Qwen3ForCausalLM(config).eval()


def _param_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _on_virtual(fraction: int) -> dict[str, Any]:
    """Options for the model on a virtual device whose budget is 1/``fraction`` of its
    weights."""
    return {
        "virtual_devices": VIRTUAL,
        "devices": ["virtual:0"],
        "budgets": {"virtual:0": _param_bytes(_model()) // fraction},
        "compiler": "eager",
    }


def _kwargs(new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    return {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "pad_token_id": 0,
        "disable_compile": True,
        "cache_implementation": "static",
    }


def _prompt() -> torch.Tensor:
    return torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(3))


def _generate_both(options: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, Any]:
    model = _model()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        expected = reference.generate(_prompt(), **_kwargs())
    model.forward = torch.compile(model.forward, backend="tensortorrent", options=options)
    with torch.no_grad():
        got = model.generate(_prompt(), **_kwargs())
    return got, expected, model


def _state_lines() -> str:
    """The lines of explain() that say where each graph's state lives."""
    text = explain(tt.tensortorrent_backend.graphs)
    lines = [
        line
        for line in text.splitlines()
        if line.startswith("Graph ") or "written in place" in line or "between calls" in line
    ]
    return re.sub(r"plan [0-9a-f]{16}", "plan <hash>", "\n".join(lines))


class TestGenerate(expecttest.TestCase):
    def test_streamed_to_a_virtual_device_the_kv_cache_stays_there(self) -> None:
        got, expected, _ = _generate_both(_on_virtual(3))
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        graphs = tt.tensortorrent_backend.graphs
        assert [g.calls for g in graphs] == [1, NEW_TOKENS - 1], "a prefill and a decode graph"
        decode = graphs[1].plan
        assert any(r.streams for r in decode.residency), "a third of the weights must stream"
        cache = [r for r in decode.cost.state if len(r.shape) == 4]
        assert len(cache) == 4 and all(r.in_place for r in cache), "keys and values in place"
        self.assertExpectedInline(
            _state_lines(),
            """\
Graph 0: 208 nodes, 26 parameters (104.77 KiB), 238.59 kFLOP, plan <hash>
  written in place (2 inputs, 16 B; a static KV cache's buffers and the like), placed by the plan:
    2 (16 B, the largest L['kwargs']['cache'].layers[0].cumulative_length scalar int64) held on virtual:0 between calls; read and updated there (as a new value): no copy per call
Graph 1: 219 nodes, 26 parameters (104.77 KiB), 48.38 kFLOP, plan <hash>
  written in place (6 inputs, 3.27 KiB; a static KV cache's buffers and the like), placed by the plan:
    6 (3.27 KiB, the largest L['kwargs']['cache'].layers[0].keys 1x2x13x8 float32) held on virtual:0 between calls; read and updated there (4 in place, 2 as a new value): no copy per call""",
        )

    def test_weights_on_disk_under_a_host_budget_the_kv_cache_in_host_memory(self) -> None:
        model = _model()
        options = {
            "budgets": {"cpu": _param_bytes(model) // 2},
            "compiler": "eager",
            "stream_chunk_bytes": 0,
        }
        got, expected, _ = _generate_both(options)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        graphs = tt.tensortorrent_backend.graphs
        decode = graphs[-1]
        assert decode.runtime.disk is not None and decode.runtime.disk.reader.bytes_read > 0
        assert any(r.reads_from_disk for r in decode.plan.residency)
        lines = _state_lines()
        assert "held" not in lines.splitlines()[-1] and "in host memory on cpu" in lines, lines


def test_from_the_second_call_prefill_keeps_the_resident_copies_of_decode() -> None:
    """Decode, called most, keeps its resident set; prefill is planned again at the second
    ``generate()`` to keep the same copies, so no call drops and makes them again. (On a
    virtual device of declared rates, the plans are the same on every machine: here each
    graph first keeps a set of its own, and decode's fits prefill.)"""
    got, expected, model = _generate_both(_on_virtual(2))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    prefill, decode = tt.tensortorrent_backend.graphs
    assert resident_set(prefill.plan) != resident_set(decode.plan), "each its own set at first"
    assert prefill.plan.follows is None and not prefill.followed
    for call in range(2):
        session = next(iter(tt.tensortorrent_backend.sessions.values()))
        held = [copy for _, copy in session.resident.copies()]
        with torch.no_grad():
            again = model.generate(_prompt(), **_kwargs())
        torch.testing.assert_close(again, expected, rtol=0, atol=0)
        assert tt.tensortorrent_backend.graphs == [prefill, decode], "replaced, not added"
        assert prefill.plan.follows == decode.plan.graph_index
        assert resident_set(prefill.plan) == resident_set(decode.plan)
        assert prefill.followed and decode.followed
        if call == 1:  # the copies made for decode were kept through prefill
            now = [copy for _, copy in session.resident.copies()]
            assert now and all(any(c is h for h in held) for c in now)
    assert [g.calls for g in (prefill, decode)] == [3, 3 * (NEW_TOKENS - 1)]
    workload = explain(tt.tensortorrent_backend.graphs).split("Workload:")[1]
    kept = len(resident_set(decode.plan))
    assert f"graph 0 keeps the {kept} resident copies of graph 1, called most" in workload, workload
    assert "drops and makes no resident copy" in workload, workload


def _raised(exc: BaseException) -> tt.KvCacheTooLarge:
    """The backend's error inside Dynamo's ``BackendCompilerFailed``."""
    inner = getattr(exc, "inner_exception", None) or exc.__cause__ or exc
    assert isinstance(inner, tt.KvCacheTooLarge), repr(exc)
    return inner


def test_a_kv_cache_the_budget_cannot_hold_is_refused_naming_the_length_that_fits() -> None:
    model = _model(positions=2048)
    options = {
        "virtual_devices": VIRTUAL,
        "devices": ["virtual:0"],
        "budgets": {"virtual:0": _param_bytes(model) // 2},
        "compiler": "eager",
    }
    model.forward = torch.compile(model.forward, backend="tensortorrent", options=options)
    calls: list[int] = []
    forward = model.forward
    model.forward = lambda *a, **k: (calls.append(1), forward(*a, **k))[1]
    with pytest.raises(Exception) as info, torch.no_grad():
        model.generate(_prompt(), **_kwargs(new_tokens=1500))
    error = _raised(info.value)
    assert isinstance(error, tt.PlanInfeasible)
    assert len(calls) == 1, "refused when the prefill graph is planned: no token was made"
    assert error.length == PROMPT + 1500 - 1
    assert error.cache_bytes == error.length * 2 * 2 * 2 * 8 * 4  # layers, k/v, heads, dim, fp32
    assert 0 < error.largest_length < error.length
    message = str(error)
    assert f"for {error.length} positions" in message
    assert f"the largest cache length that fits is {error.largest_length} positions" in message

    # The length it names fits the prefill graph, which then runs; the decode graph (which
    # holds the cache and its reads at once) may need more, and names its own length.
    torch._dynamo.reset()
    tt.tensortorrent_backend.reset()
    model = _model(positions=2048)
    model.forward = torch.compile(model.forward, backend="tensortorrent", options=options)
    calls.clear()
    forward = model.forward
    model.forward = lambda *a, **k: (calls.append(1), forward(*a, **k))[1]
    new_tokens = error.largest_length - PROMPT + 1
    try:
        with torch.no_grad():
            model.generate(_prompt(), **_kwargs(new_tokens=new_tokens))
    except Exception as exc:
        cause = _raised(exc)
        assert len(calls) == 2, "the prefill graph ran; the decode graph was refused"
        assert cause.length == error.largest_length
        assert 0 < cause.largest_length < error.largest_length
    else:
        assert len(calls) == new_tokens


def test_the_kv_cache_of_the_call_that_compiled_is_not_kept_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dynamo's tracing leaves garbage that refers to the cache it traced with; the backend
    collects it before the first call of a graph whose inputs are large (a cache of 32 MiB
    or more; here every graph's, the cache being small), so the cache goes when
    ``generate()`` returns rather than at some later cyclic collection (with a second cache
    made meanwhile)."""
    import gc

    from tensortorrent_dynamo import session

    monkeypatch.setattr(session._CompileGarbage, "BIG_INPUTS", 1)

    torch._dynamo.reset()
    model = _model()
    model.forward = torch.compile(
        model.forward, backend="tensortorrent", options={"compiler": "eager"}
    )
    cache_shape = (1, 2, PROMPT + NEW_TOKENS - 1, 8)  # batch, KV heads, positions, head dim
    gc.disable()  # as in a process whose next cyclic collection is far away
    try:
        with torch.no_grad():
            model.generate(_prompt(), **_kwargs())
        alive = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.shape == cache_shape]
    finally:
        gc.enable()
    assert [g.calls for g in tt.tensortorrent_backend.graphs] == [1, NEW_TOKENS - 1]
    assert alive == [], f"{len(alive)} tensors of the cache's shape outlived generate()"
