"""Every corpus entry through the backend at no budget and at a third of its parameters'
bytes, called twice with different inputs (the first under ``torch.no_grad()``, the second
under ``torch.inference_mode()``, as people call models for inference), compared with eager;
afterwards the original module still gives eager's result and its tensors are unchanged.
Every entry also runs on the host alone with a third of its parameters' bytes in RAM, the
rest read from disk."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

import pytest
import torch

import tensortorrent as tt
from tests.mapped import holds_its_file

from .harness import (
    DEVICE,
    INFERENCE_CONTEXTS,
    assert_same,
    assert_tensors_equal,
    budget_bytes,
    check_plans,
    disk_options,
    entry_cases,
    leaves,
    options,
    param_bytes,
    peak,
    quick_only,
)
from .models import (
    AUTOCAST_MODELS,
    BFLOAT16_MODELS,
    BUDGETS,
    BY_NAME,
    CHANNELS_LAST_MODELS,
    DEFAULT_COMPILER_MODELS,
    ENTRIES,
    EVERY_OUTPUT_MODELS,
    Entry,
)


@pytest.mark.parametrize(("entry", "budget"), entry_cases(ENTRIES, BUDGETS))
def test_entry_matches_eager(entry: Entry, budget: str) -> None:
    model = entry.build()
    reference = copy.deepcopy(model)
    calls = [entry.inputs(0), entry.inputs(1)]
    with torch.no_grad():
        expected = [reference(**kwargs) for kwargs in calls]

    compiled = tt.compile(model, **options(budget, model))
    for i, kwargs in enumerate(calls):
        with INFERENCE_CONTEXTS[i]():
            assert_same(compiled(**kwargs), expected[i], f"call {i + 1}")
    check_plans(compiled.graphs, budget)
    assert 0 < peak(compiled) <= budget_bytes(budget, model)

    # the original module, called without the backend, is as it was
    with torch.no_grad():
        assert_same(model(**entry.inputs(0)), expected[0], "the original module afterwards")
    assert_tensors_equal(model, reference)


@pytest.mark.parametrize(("entry", "budget"), entry_cases(ENTRIES, ("disk",)))
def test_entry_streams_from_disk_within_a_host_budget(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """With no accelerator and a host budget of a third of the parameters' bytes, the plans
    keep what fits in RAM and read the rest from the disk tier on every call: two calls with
    different inputs match eager, some weight is read from disk, and no graph's predicted
    host peak is over the budget. Afterwards the original module, whose tensors of the
    weights moved to disk now map their bytes there, still gives eager's result."""
    model = entry.build()
    reference = copy.deepcopy(model)
    calls = [entry.inputs(0), entry.inputs(1)]
    with torch.no_grad():
        expected = [model(**kwargs) for kwargs in calls]

    opts = disk_options(model, tmp_path)
    limit = opts["budgets"]["cpu"]
    compiled = tt.compile(model, **opts)
    for i, kwargs in enumerate(calls):
        with INFERENCE_CONTEXTS[i]():
            assert_same(compiled(**kwargs), expected[i], f"call {i + 1}")
    graphs = compiled.graphs
    assert any(r.reads_from_disk for g in graphs for r in g.plan.residency), (
        "a third of the parameters' bytes in RAM: some weight must be read from disk"
    )
    peaks = {g.plan.graph_index: g.plan.predicted_peak("cpu") for g in graphs}
    assert all(p <= limit for p in peaks.values()), f"host peaks over {limit} B: {peaks}"

    with torch.no_grad():
        assert_same(model(**entry.inputs(0)), expected[0], "the original module afterwards")
    assert_tensors_equal(model, reference)


def _bfloat16(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in kwargs.items()
    }


def _streamed_calls_match_eager(
    model: torch.nn.Module, calls: list[dict[str, Any]], budget: str, tmp_path: Path
) -> tuple[tt.CompiledModule, dict[str, Any]]:
    """``model`` compiled at ``budget`` (``"third"``: to the virtual device; ``"disk"``: a
    third in RAM, the rest on disk); each call matches eager's, the first under
    ``torch.no_grad()``, the second under ``torch.inference_mode()``. Returns the compiled
    model and its options."""
    with torch.no_grad():
        expected = [model(**kwargs) for kwargs in calls]
    opts = disk_options(model, tmp_path) if budget == "disk" else options(budget, model)
    compiled = tt.compile(model, **opts)
    for i, kwargs in enumerate(calls):
        with INFERENCE_CONTEXTS[i]():
            assert_same(compiled(**kwargs), expected[i], f"call {i + 1}")
    return compiled, opts


@pytest.mark.parametrize(
    ("entry", "budget"),
    entry_cases([BY_NAME[name] for name in BFLOAT16_MODELS], ("third", "disk"), False),
)
def test_entry_in_bfloat16_matches_eager(entry: Entry, budget: str, tmp_path: Path) -> None:
    """The model and its floating inputs in bfloat16, streamed at a third of its parameters'
    bytes (to the virtual device, or from disk under a host budget): two calls match eager
    in bfloat16, within bfloat16's tolerance."""
    model = entry.build().to(torch.bfloat16)
    calls = [_bfloat16(entry.inputs(0)), _bfloat16(entry.inputs(1))]
    compiled, _ = _streamed_calls_match_eager(model, calls, budget, tmp_path)
    streamed = sum(r.streams for g in compiled.graphs for r in g.plan.residency)
    assert streamed > 0, "a third of the parameters' bytes: some parameter must stream"


def _dtypes(output: Any) -> dict[str, torch.dtype]:
    """The dtype of each tensor of a model's output, by its path."""
    return {path: v.dtype for path, v in leaves(output) if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize(
    ("entry", "budget"),
    quick_only(
        entry_cases([BY_NAME[name] for name in AUTOCAST_MODELS], ("third", "disk"), False),
        {"llama-third"},
    ),
)
# torch's, of an RMSNorm's float32 weight with a bfloat16 input (flux's, in eager as compiled)
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
def test_entry_under_autocast_matches_eager(entry: Entry, budget: str, tmp_path: Path) -> None:
    """Called under ``torch.autocast("cpu", dtype=torch.bfloat16)`` and streamed at a third
    of its parameters' bytes (to the virtual device, or from disk under a host budget): two
    calls match eager under the same autocast, in the same dtypes; a call without autocast
    afterwards matches plain eager."""
    model = entry.build()
    calls = [entry.inputs(0), entry.inputs(1)]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    with torch.no_grad():
        with autocast:
            expected = [model(**kwargs) for kwargs in calls]
        plain = model(**calls[0])
    opts = disk_options(model, tmp_path) if budget == "disk" else options(budget, model)
    compiled = tt.compile(model, **opts)
    for i, kwargs in enumerate(calls):
        with INFERENCE_CONTEXTS[i](), autocast:
            got = compiled(**kwargs)
        assert_same(got, expected[i], f"call {i + 1} under autocast")
        assert _dtypes(got) == _dtypes(expected[i]), f"call {i + 1}: dtypes differ from eager's"
    assert torch.bfloat16 in _dtypes(expected[0]).values(), "autocast ran nothing in bfloat16"
    with torch.no_grad():
        assert_same(compiled(**calls[0]), plain, "a call without autocast")
    streamed = sum(r.streams for g in compiled.graphs for r in g.plan.residency)
    assert streamed > 0, "a third of the parameters' bytes: some parameter must stream"


@pytest.mark.parametrize(
    ("entry", "budget"),
    quick_only(
        entry_cases([BY_NAME[name] for name in DEFAULT_COMPILER_MODELS], ("none", "disk"), False),
        set(),  # Inductor's cold compiles take too long for make check
    ),
)
@pytest.mark.inductor
def test_entry_with_the_default_compiler_matches_eager(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """On the host with the options' defaults (Inductor segments, kept where they time
    faster than eager), with no budget and with a third of the parameters' bytes in RAM and
    the rest on disk: three calls match eager, and the model's tensors are unchanged (the
    timing at compile time runs on copies of what the graph writes)."""
    model = entry.build()
    reference = copy.deepcopy(model)
    calls = [entry.inputs(0), entry.inputs(1), entry.inputs(0)]
    with torch.no_grad():
        expected = [reference(**kwargs) for kwargs in calls]
    opts: dict[str, Any] = {}
    if budget == "disk":
        opts = disk_options(model, tmp_path)
        del opts["compiler"]
    compiled = tt.compile(model, **opts)
    for i, kwargs in enumerate(calls):
        with INFERENCE_CONTEXTS[i % 2]():
            assert_same(compiled(**kwargs), expected[i], f"call {i + 1}")
    compilers = {c for g in compiled.graphs for c in g.compilers.values()}
    assert "inductor" in compilers or any(g.compiler_note for g in compiled.graphs), compilers
    assert_tensors_equal(model, reference)


@pytest.mark.parametrize(
    ("entry", "budget"),
    entry_cases([BY_NAME[name] for name in CHANNELS_LAST_MODELS], ("third", "disk"), False),
)
def test_entry_in_channels_last_matches_eager(entry: Entry, budget: str, tmp_path: Path) -> None:
    """The model in ``channels_last`` (its convolution weights dense, not row-major),
    streamed at a third of its parameters' bytes (to the virtual device, or from disk under
    a host budget): two calls match eager. On disk, a weight is stored as it is in memory
    and read back with its strides: stored row-major, its tensor changed strides under
    Dynamo's guards, which then failed on the frame just compiled."""
    model = entry.build().to(memory_format=torch.channels_last)
    calls = [entry.inputs(0), entry.inputs(1)]
    compiled, _ = _streamed_calls_match_eager(model, calls, budget, tmp_path)
    if budget == "disk":
        assert any(r.reads_from_disk for g in compiled.graphs for r in g.plan.residency)


@pytest.mark.parametrize(
    ("entry", "budget"),
    entry_cases([BY_NAME[name] for name in EVERY_OUTPUT_MODELS], ("third", "disk"), False),
)
def test_entry_returning_every_layers_outputs_matches_eager(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """Asked for every layer's hidden states and attention maps, the model breaks the graph
    in each layer, and every layer calls the same graphs with its own weights: each layer's
    weights are planned apart (named ``...@1``, ``...@2``), streamed at a third of the
    parameters' bytes (to the virtual device, or from disk under a host budget). Two calls
    match eager, within the budget."""
    model = entry.build()
    every = {"output_attentions": True, "output_hidden_states": True}
    calls = [{**entry.inputs(i), **every} for i in range(2)]
    compiled, opts = _streamed_calls_match_eager(model, calls, budget, tmp_path)
    names = [p.fqn for g in compiled.graphs for p in g.plan.cost.params]
    assert any("@" in name for name in names), "no graph was called with another layer's weights"
    if budget == "disk":
        limit = opts["budgets"]["cpu"]
        peaks = {g.plan.graph_index: g.plan.predicted_peak("cpu") for g in compiled.graphs}
        assert all(p <= limit for p in peaks.values()), f"host peaks over {limit} B: {peaks}"
    else:
        assert 0 < peak(compiled) <= budget_bytes(budget, model)


@pytest.mark.parametrize(
    ("entry", "budget"),
    quick_only(
        entry_cases([BY_NAME[name] for name in BFLOAT16_MODELS], (*BUDGETS, "disk"), False),
        {"llama-none", "llama-third", "llama-disk"},
    ),
)
def test_entry_converted_after_compiling_matches_eager(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """Compiled and called in float32, then converted with ``model.to(bfloat16)`` and back
    (each parameter keeps its object and is given new bytes; the buffers are new tensors):
    each call matches the converted model run eagerly. Before, the copies kept on the
    accelerator and the weights read from disk were of the old bytes (a wrong answer or a
    dtype mismatch)."""
    model = entry.build()
    opts = disk_options(model, tmp_path) if budget == "disk" else options(budget, model)
    compiled = tt.compile(model, **opts)
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16, torch.float32):
            model.to(dtype)
            kwargs = _bfloat16(entry.inputs(0)) if dtype == torch.bfloat16 else entry.inputs(0)
            assert_same(compiled(**kwargs), model(**kwargs), f"in {dtype}")


# a decoder, an encoder-decoder, an encoder and a diffusion transformer at every budget (the
# decoder on disk in the quick subset)
REFUSED = quick_only(
    entry_cases([BY_NAME[name] for name in ("llama", "t5", "bert", "flux")], ("third", "disk")),
    {"llama-third", "t5-disk"},
)


@pytest.mark.parametrize(("entry", "budget"), REFUSED)
def test_a_refusal_says_what_each_peak_holds(entry: Entry, budget: str, tmp_path: Path) -> None:
    """At a twentieth of its weights' bytes (on the virtual device, or in RAM with the rest
    on disk) the model is refused, and the refusal says what the device holds at its peak:
    the model's own weights by name and the values live, named with the modules that made
    them, adding up to the budget it asks for."""
    model = entry.build()
    if budget == "disk":
        opts = disk_options(model, tmp_path)
        device = "cpu"
    else:
        opts = options(budget, model)
        device = DEVICE
    opts["budgets"] = {device: param_bytes(model) // 20}
    compiled = tt.compile(model, **opts)
    with pytest.raises(tt.PlanInfeasible) as refused, torch.no_grad():
        compiled(**entry.inputs(0))
    error = refused.value
    (peak,) = error.peaks
    assert peak.device == device and peak.bytes == error.min_budgets[device]
    weights = [*peak.resident, *peak.streamed, *peak.reading]
    pieces = [*weights, *peak.activations]
    assert sum(size for _, size in pieces) == peak.bytes
    names = {name for name, _ in model.named_parameters()} | {
        name for name, _ in model.named_buffers()
    }
    # a weight read in row chunks is named by its chunk: ``name[r0:r1]``
    assert all(name.split("[", 1)[0] in names for name, _ in weights), weights
    assert peak.activations, "a model's call makes values"
    scopes = {name.split(" (", 1)[1][:-1] for name, _ in peak.activations if " (" in name}
    assert scopes, peak.activations
    modules = dict(model.named_modules())
    assert all(scope in modules for scope in scopes), scopes
    assert f"{device}'s peak of" in str(error)


FOUR_FAMILIES = quick_only(
    entry_cases(
        [BY_NAME[name] for name in ("llama", "t5", "bert", "flux")], (*BUDGETS, "disk"), False
    ),
    {"llama-disk"},
)


@pytest.mark.parametrize(("entry", "budget"), FOUR_FAMILIES)
def test_entry_built_under_inference_mode_matches_eager(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """A model built (or loaded) under ``torch.inference_mode()`` has inference tensors for
    weights, which have no version counter. Before, every budget failed at compile time
    (``Inference tensors do not track version counter``)."""
    with torch.inference_mode():
        model = entry.build()
        expected = [model(**entry.inputs(i)) for i in range(2)]
    opts = disk_options(model, tmp_path) if budget == "disk" else options(budget, model)
    compiled = tt.compile(model, **opts)
    with torch.inference_mode():
        for i, want in enumerate(expected):
            assert_same(compiled(**entry.inputs(i)), want, f"call {i + 1}")


def _first(out: Any) -> torch.Tensor:
    """A layer's hidden states (decoder layers return them alone or first in a tuple)."""
    return out if isinstance(out, torch.Tensor) else cast("torch.Tensor", out[0])


@pytest.mark.parametrize(
    ("entry", "budget"),
    quick_only(entry_cases([BY_NAME["llama"]], (*BUDGETS, "disk"), False), {"llama-disk"}),
)
def test_entry_with_hooks_added_after_compiling_matches_eager(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """With Dynamo guarding on module hooks (``skip_nnmodule_hook_guards=False``; by default
    it does not, and hooks added after the first call do not run, as with
    ``torch.compile``), a forward hook added after compiling runs: one capturing a layer's
    output sees eager's, one changing it changes the result as in eager, and once removed
    the model computes as before."""
    model = entry.build()
    layer = cast("Any", model).model.layers[0]
    kwargs = entry.inputs(0)
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False), torch.no_grad():
        opts = disk_options(model, tmp_path) if budget == "disk" else options(budget, model)
        compiled = tt.compile(model, **opts)
        expected = model(**kwargs)
        assert_same(compiled(**kwargs), expected, "before the hooks")
        seen: list[torch.Tensor] = []
        capture = layer.register_forward_hook(lambda m, a, out: seen.append(_first(out).clone()))
        model(**kwargs)
        compiled(**kwargs)
        capture.remove()
        assert len(seen) == 2, "the capturing hook ran in eager and in the compiled model"
        torch.testing.assert_close(seen[1], seen[0])

        def halve(module: Any, args: Any, out: Any) -> Any:
            return out * 0.5 if isinstance(out, torch.Tensor) else (out[0] * 0.5, *out[1:])

        change = layer.register_forward_hook(halve)
        assert_same(compiled(**kwargs), model(**kwargs), "with a hook changing the output")
        change.remove()
        assert_same(compiled(**kwargs), expected, "hooks removed")


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks ``model`` repeats, as its users compile them on their own (regional
    compilation): diffusers' ``_repeated_blocks`` (what ``compile_repeated_blocks``
    compiles), else each outermost module of a class transformers will not split across
    devices (``_no_split_modules``: its layers)."""
    repeated = getattr(model, "_repeated_blocks", None)
    if repeated:
        return [m for m in model.modules() if type(m).__name__ in repeated]
    classes = set(getattr(model, "_no_split_modules", None) or ())
    found: list[torch.nn.Module] = []

    def walk(module: torch.nn.Module) -> None:
        for child in module.children():
            (found.append if type(child).__name__ in classes else walk)(child)

    walk(model)
    return found


BLOCK_BY_BLOCK_MODELS = (
    "llama", "mixtral", "gemma3", "jamba", "qwen3_next", "t5", "whisper", "bert", "vit", "flux",
    "wan", "qwenimage",
)  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "budget"),
    quick_only(
        entry_cases([BY_NAME[name] for name in BLOCK_BY_BLOCK_MODELS], ("third", "disk"), False),
        {"llama-third", "flux-disk"},
    ),
)
def test_entry_compiled_block_by_block_matches_eager(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """Each repeated block compiled on its own (regional compilation, which diffusers and
    transformers recommend to compile faster): the blocks share a Dynamo frame and its
    graph, each block's weights are planned apart (named apart), and the budget is one for
    all of them: two calls match eager, and no block's plan goes over it. (qwen3_next at a
    third ran over its plan, out of memory on the device, until the simulator held a value
    read on another device until its segment returns it, as the runtime does; its layer's
    second graph, of symbolic sizes, had nodes that could not be costed, its padding among
    them, until they were costed with the Python dispatcher.)"""
    model = entry.build()
    calls = [entry.inputs(0), entry.inputs(1)]
    with torch.no_grad():
        expected = [model(**kwargs) for kwargs in calls]
    blocks = _blocks(model)
    assert len(blocks) > 1
    # a third of the blocks' weights (the rest of the model runs eagerly, outside the plans)
    in_blocks = torch.nn.ModuleList(blocks)
    opts = disk_options(in_blocks, tmp_path) if budget == "disk" else options(budget, in_blocks)
    if getattr(model, "_repeated_blocks", None):
        cast("Any", model).compile_repeated_blocks(backend="tensortorrent", options=opts)
    else:
        for block in blocks:
            block.compile(backend="tensortorrent", options=opts)
    for i, kwargs in enumerate(calls):
        with INFERENCE_CONTEXTS[i]():
            assert_same(model(**kwargs), expected[i], f"call {i + 1}")
    graphs = tt.tensortorrent_backend.graphs
    names = {p.fqn for g in graphs for p in g.plan.cost.params}
    assert any(name.endswith("@1") for name in names), f"blocks named apart: {sorted(names)}"
    if budget == "disk":
        limit = opts["budgets"]["cpu"]
        assert any(r.reads_from_disk for g in graphs for r in g.plan.residency)
        peaks = {g.plan.graph_index: g.plan.predicted_peak("cpu") for g in graphs}
    else:
        limit = budget_bytes(budget, in_blocks)
        assert any(r.streams for g in graphs for r in g.plan.residency)
        peaks = {g.plan.graph_index: g.runtime.virtual[DEVICE].ledger.peak for g in graphs}
    assert all(p <= limit for p in peaks.values()), f"peaks over {limit} B: {peaks}"


@pytest.mark.parametrize(("entry", "budget"), FOUR_FAMILIES)
@pytest.mark.parametrize("scheme", ["int8_weight_only", "int8_dynamic"])
def test_entry_quantized_with_torchao_matches_eager(
    entry: Entry, budget: str, scheme: str, tmp_path: Path
) -> None:
    """Weights quantized by ``torchao`` (``quantize_``: int8 weights, and int8 activations
    too) are tensor subclasses, which AOTAutograd takes apart into their plain tensors (the
    int8 data and its scales): each part is planned as a weight of its own (kept, streamed,
    or read from disk), and two calls match the quantized model run eagerly. Before, every
    budget was refused (``the functional graph takes 99 inputs where Dynamo's graph takes
    41``)."""
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    model = entry.build()
    config = (
        Int8WeightOnlyConfig()
        if scheme == "int8_weight_only"
        else Int8DynamicActivationInt8WeightConfig()
    )
    quantize_(model, config)
    calls = [entry.inputs(0), entry.inputs(1)]
    with torch.no_grad():
        expected = [model(**kwargs) for kwargs in calls]
    opts = disk_options(model, tmp_path) if budget == "disk" else options(budget, model)
    compiled = tt.compile(model, **opts)
    with torch.no_grad():
        for i, kwargs in enumerate(calls):
            assert_same(compiled(**kwargs), expected[i], f"call {i + 1}")
    names = [p.fqn for g in compiled.graphs for p in g.plan.cost.params]
    assert any(name.endswith(".qdata") for name in names), names[:8]
    if budget == "disk":
        limit = opts["budgets"]["cpu"]
        assert all(g.plan.predicted_peak("cpu") <= limit for g in compiled.graphs)


# the attention projections a LoRA adapter is put on, by model
LORA_TARGETS = {"llama": ["q_proj", "v_proj"], "t5": ["q", "v"], "bert": ["query", "value"]}


@pytest.mark.parametrize(
    ("entry", "budget"),
    quick_only(
        entry_cases([BY_NAME[name] for name in LORA_TARGETS], (*BUDGETS, "disk"), False),
        {"llama-none", "llama-disk"},
    ),
)
# PEFT asks transformers' model a question transformers renamed
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_entry_with_an_adapter_merged_after_compiling_matches_eager(
    entry: Entry, budget: str, tmp_path: Path
) -> None:
    """A PEFT LoRA adapter merged after compiling (``merge_adapter()`` adds its product to
    each weight through ``.data``: no version counter moves, no address changes), then
    unmerged: each call matches the model run eagerly. Before, the copies kept on the
    accelerator were of the unmerged weights (a wrong answer, silently). On the disk tier a
    merged weight whose bytes were moved to disk holds its new bytes in pages copied out of
    the file's mapping, which the plan does not read: they are seen, taken into RAM of the
    weight's own, and the graph planned again with them."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules=LORA_TARGETS[entry.name], init_lora_weights=False)
    model = get_peft_model(entry.build(), config).eval()
    opts = disk_options(model, tmp_path) if budget == "disk" else options(budget, model)
    compiled = tt.compile(model, **opts)
    kwargs = entry.inputs(0)
    with torch.no_grad():
        assert_same(compiled(**kwargs), model(**kwargs), "with the adapter")
        if budget == "disk":
            assert any(holds_its_file(p) for n, p in model.named_parameters() if "base_layer" in n)
        model.merge_adapter()
        assert_same(compiled(**kwargs), model(**kwargs), "merged")
        model.unmerge_adapter()
        assert_same(compiled(**kwargs), model(**kwargs), "unmerged")


def _built_on_meta(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s architecture built on the meta device as its users build it (its
    buffers real: rotary tables are computed at construction); not tied yet."""
    from accelerate import init_empty_weights

    cls: Any = type(model)
    config: Any = getattr(model, "config", None)
    with init_empty_weights(include_buffers=False):
        # diffusers' models are built from their config's values, transformers' from it
        meta = cls.from_config(config) if not hasattr(config, "model_type") else cls(config)
    return cast("torch.nn.Module", meta.eval())


@pytest.mark.parametrize(
    ("entry", "budget"),
    quick_only(
        entry_cases(
            [BY_NAME[name] for name in ("llama", "gpt2", "t5", "bert", "whisper", "flux")],
            ("none", "disk"),
            False,
        ),
        {"t5-disk"},
    ),
)
@pytest.mark.parametrize("sharded", [False, True], ids=["one_file", "sharded"])
def test_entry_built_on_meta_runs_from_the_checkpoint_it_saved(
    entry: Entry, budget: str, sharded: bool, tmp_path: Path
) -> None:
    """``save_pretrained`` writes the checkpoint (a tied weight once: GPT-2's, T5's and
    BERT's output heads are their embeddings), in one file or sharded over four with an
    index (as it writes a large model); the model built again on the meta device runs from
    it, in RAM (no budget) or with a third of its bytes in RAM and the rest read from the
    files: two calls match the saved model's. The tied heads were refused as missing from
    the file; a sharded checkpoint could not be given."""
    reference = entry.build()
    saved = tmp_path / "saved"
    if sharded:
        quarter = param_bytes(reference) // 4
        reference.save_pretrained(saved, max_shard_size=quarter)  # type: ignore[operator]
        assert len(list(saved.glob("*.safetensors"))) > 1
        checkpoint = saved
    else:
        reference.save_pretrained(saved)  # type: ignore[operator]
        (checkpoint,) = saved.glob("*.safetensors")
    model = _built_on_meta(reference)
    opts: dict[str, Any] = {"checkpoint": str(checkpoint), "compiler": "eager"}
    if budget == "disk":
        opts |= {"budgets": {"cpu": param_bytes(reference) // 3}, "offload_dir": str(tmp_path)}
    compiled = tt.compile(model, **opts)
    for i in range(2):
        with INFERENCE_CONTEXTS[i]():
            assert_same(compiled(**entry.inputs(i)), reference(**entry.inputs(i)), f"call {i}")


@pytest.mark.corpus
def test_a_checkpoint_whose_names_are_not_the_models_is_refused_with_the_way_out(
    tmp_path: Path,
) -> None:
    """Transformers splits a mixture of experts' fused weights when it saves them (and
    fuses them again when it loads): such a file cannot be read in place, and the error
    says which to write instead, which then runs."""
    import safetensors.torch

    entry = BY_NAME["qwen3_moe"]
    reference = entry.build()
    reference.save_pretrained(tmp_path / "saved")  # type: ignore[operator]
    with pytest.raises(tt.CheckpointError, match=r"experts\.gate_up_proj.*save_model"):
        tt.compile(
            _built_on_meta(reference), checkpoint=str(tmp_path / "saved" / "model.safetensors")
        )
    safetensors.torch.save_model(reference, str(tmp_path / "own.safetensors"))
    compiled = tt.compile(
        _built_on_meta(reference), checkpoint=str(tmp_path / "own.safetensors"), compiler="eager"
    )
    with torch.no_grad():
        assert_same(compiled(**entry.inputs(0)), reference(**entry.inputs(0)))


@pytest.mark.corpus
@pytest.mark.parametrize(
    "how", ["cpu_offload", pytest.param("disk_offload", marks=pytest.mark.corpus_full)]
)
def test_a_model_offloaded_by_accelerate_runs_with_a_warning(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model dispatched by Accelerate with offloading has its weights on the meta device,
    held by hooks that put them in place at each call: as with ``torch.compile``, it runs
    and matches eager, with a warning that those weights are outside the plan. Before,
    ``tt.compile`` refused it as weights missing from any checkpoint."""
    import accelerate

    entry = BY_NAME["llama"]
    model = entry.build()
    with torch.no_grad():
        expected = model(**entry.inputs(0))
    if how == "cpu_offload":
        accelerate.cpu_offload(model, execution_device="cpu")
    else:
        accelerate.disk_offload(model, str(tmp_path / "accelerate"), execution_device="cpu")
    with caplog.at_level("WARNING", logger="tensortorrent_dynamo"):
        compiled = tt.compile(model, **disk_options(model, tmp_path / "offload"))
    assert any("Accelerate's offload hooks" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        for _ in range(2):
            assert_same(compiled(**entry.inputs(0)), expected)


@pytest.mark.inductor
def test_inductor_compiles_a_third_party_models_functional_graph() -> None:
    """The host segment of a real model compiles with Inductor, not falling back to eager
    (a fallback warns, and warnings fail the tests): the functional graph's outputs are
    flat, where Dynamo's nested tuples (a KV cache) made Inductor refuse them."""
    entry = BY_NAME["gpt2"]
    model = entry.build()
    reference = copy.deepcopy(model)
    compiled = tt.compile(model, devices=["cpu"], compiler="inductor")
    with torch.no_grad():
        for i in range(2):
            assert_same(compiled(**entry.inputs(i)), reference(**entry.inputs(i)), f"call {i}")
    assert compiled.graphs
    for graph in compiled.graphs:
        for name in graph.compilers:
            segment = getattr(graph.module, name)
            assert segment.fn is not segment.eager_fn, f"{name} was not compiled by Inductor"
