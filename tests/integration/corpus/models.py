"""The corpus: every third-party model the corpus tests run, in one registry.

Each entry is a real architecture from an installed package (transformers, diffusers),
built from a tiny config with random weights (seeded; nothing is downloaded), in eval
mode. ``inputs(seed)`` gives the keyword arguments of one call; seeds 0 and 1 give two
different input sets (for the token models a different sequence length too, so the
second call is a new shape for Dynamo).

Known failures are recorded here and nowhere else: ``xfail`` maps a budget (``"none"``,
``"third"``) to the reason, ``GENERATE_XFAIL`` maps a ``generate()`` case to its
reason. A reason starts with the name of the exception the case raises (the strict xfail
expects that exception and no other) and says the cause in one line. Each was checked
to fail the same way twice; a case that passes is not marked (a strict xfail that
passes fails the run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

SEED = 0
VOCAB = 128

Inputs = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    family: str  # the package's model family (its ``model_type``)
    exercises: str  # what this architecture brings that the others do not
    build: Callable[[], nn.Module]
    inputs: Callable[[int], Inputs]
    quick: bool = False  # in the subset CI runs; the rest runs with ``make corpus``
    xfail: Mapping[str, str] = dataclasses.field(default_factory=dict)  # budget -> reason


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + seed)


def _seq(seed: int) -> int:
    return 8 + 3 * seed  # 8 tokens, then 11


def _tokens(seed: int, vocab: int = VOCAB, batch: int = 2, low: int = 3) -> torch.Tensor:
    return torch.randint(low, vocab, (batch, _seq(seed)), generator=_generator(seed))


def _padded_mask(ids: torch.Tensor, seed: int) -> torch.Tensor:
    """All ones but the second row's last ``3 + seed`` positions (right padding)."""
    mask = torch.ones_like(ids)
    mask[1, -(3 + seed) :] = 0
    return mask


def decoder_inputs(seed: int) -> Inputs:
    return {"input_ids": _tokens(seed), "use_cache": False}


def encoder_inputs(seed: int) -> Inputs:
    ids = _tokens(seed)
    return {"input_ids": ids, "attention_mask": _padded_mask(ids, seed)}


def seq2seq_inputs(seed: int) -> Inputs:
    ids = _tokens(seed)
    g = _generator(seed + 100)
    return {
        "input_ids": ids,
        "attention_mask": _padded_mask(ids, seed),
        "decoder_input_ids": torch.randint(3, VOCAB, (2, 5 + seed), generator=g),
        "use_cache": False,
    }


def image_inputs(seed: int, size: int = 32) -> Inputs:
    return {"pixel_values": torch.randn(2, 3, size, size, generator=_generator(seed))}


def audio_inputs(seed: int) -> Inputs:
    return {"input_values": torch.randn(2, 1600 + 320 * seed, generator=_generator(seed))}


def text_image_inputs(seed: int) -> Inputs:
    """Token ids with a padded mask, and images: a two-tower model's text and pixels."""
    return {**encoder_inputs(seed), **image_inputs(seed + 100)}


def _seeded(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(SEED)
        return make().eval()

    return build


def _causal_lm(config_name: str, **config: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        model: nn.Module = transformers.AutoModelForCausalLM.from_config(cfg)
        return model

    return _seeded(make)


def _auto(auto_class: str, config_name: str, **config: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        model: nn.Module = getattr(transformers, auto_class).from_config(cfg)
        return model

    return _seeded(make)


def _model(class_name: str, config_name: str, **config: Any) -> Callable[[], nn.Module]:
    """A transformers model class with no Auto class for its task, built from its config."""

    def make() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        model: nn.Module = getattr(transformers, class_name)(cfg)
        return model

    return _seeded(make)


def _series_inputs(seed: int) -> Inputs:
    """A batch of 2 (then 3) series of 16 steps of 3 channels."""
    return {"past_values": torch.randn(2 + seed, 16, 3, generator=_generator(seed))}


# the common shape of the decoder LMs: hidden 64, 4 layers, 4 heads (2 KV heads), vocab 128.
# Four layers, not two: with two, a third of the parameters is less than one layer's
# weights plus the prefetched next ones, and the planner rightly finds no plan
# (PlanInfeasible); a third must force streaming, not be infeasible.
LAYERS = 4
LM = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


# the towers of the text-and-image models: 2 layers each, hidden 32, 32x32 images in 8x8 patches
TOWER_TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}
TOWER_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 32,
    "patch_size": 8,
}


def _whisper_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    return {
        "input_features": torch.randn(2, 16, 32, generator=g),
        "decoder_input_ids": torch.randint(3, VOCAB, (2, 4 + seed), generator=g),
        "use_cache": False,
    }


def _diffusers(class_name: str, **config: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import diffusers

        model: nn.Module = getattr(diffusers, class_name)(**config)
        return model

    return _seeded(make)


def _vae_inputs(seed: int) -> Inputs:
    return {"sample": torch.randn(2, 3, 16, 16, generator=_generator(seed))}


def _video_vae_inputs(seed: int) -> Inputs:
    """One clip of 5 frames of 16x16."""
    return {"sample": torch.randn(1, 3, 5, 16, 16, generator=_generator(seed))}


def _mmdit_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    return {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "timestep": torch.tensor([10 + 7 * seed, 500]),
        "encoder_hidden_states": torch.randn(2, 6 + seed, 32, generator=g),
        "pooled_projections": torch.randn(2, 32, generator=g),
    }


def _flux_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    image, text = 16, 6 + seed  # a 4x4 latent as 16 tokens of 16 channels; text tokens
    return {
        "hidden_states": torch.randn(2, image, 16, generator=g),
        "encoder_hidden_states": torch.randn(2, text, 32, generator=g),
        "pooled_projections": torch.randn(2, 32, generator=g),
        "timestep": torch.tensor([0.1 + 0.1 * seed, 0.5]),
        "img_ids": torch.zeros(image, 3),
        "txt_ids": torch.zeros(text, 3),
    }


def _pixart_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    return {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(2, 5 + seed, 24, generator=g),
        "timestep": torch.tensor([10 + seed, 500]),
    }


def _wan_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    return {
        "hidden_states": torch.randn(1, 4, 2, 8, 8, generator=g),  # 2 frames of 8x8
        "timestep": torch.tensor([10 + seed]),
        "encoder_hidden_states": torch.randn(1, 6 + seed, 32, generator=g),
    }


def _sana_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    return {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(2, 5 + seed, 32, generator=g),
        "timestep": torch.tensor([10 + seed, 500]),
    }


def _qwenimage_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    text = 6 + seed
    return {
        "hidden_states": torch.randn(1, 16, 16, generator=g),  # a 4x4 latent as 16 tokens
        "encoder_hidden_states": torch.randn(1, text, 32, generator=g),
        "encoder_hidden_states_mask": torch.ones(1, text, dtype=torch.long),
        "timestep": torch.tensor([0.5 + 0.1 * seed]),
        "img_shapes": [(1, 4, 4)],
    }


IMAGE_TOKEN = VOCAB - 1
"""Llava's image token: the ids where the vision tower's features go."""


def _llava() -> nn.Module:
    import transformers

    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**TOWER_VISION),
        # 8 layers: at 4, a third is under what the vision tower and one layer need
        text_config=transformers.LlamaConfig(**(LM | {"num_hidden_layers": 8})),
        image_token_index=IMAGE_TOKEN,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
    )
    model: nn.Module = transformers.LlavaForConditionalGeneration(config)
    return model


def _llava_inputs(seed: int) -> Inputs:
    """One image per prompt: as many image tokens as the vision tower has patches (32x32
    in 8x8 patches: 16), then text."""
    patches = (TOWER_VISION["image_size"] // TOWER_VISION["patch_size"]) ** 2
    text = _tokens(seed, vocab=IMAGE_TOKEN)
    ids = torch.cat([torch.full((2, patches), IMAGE_TOKEN), text], dim=1)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.randn(2, 3, 32, 32, generator=_generator(seed + 100)),
        "use_cache": False,
    }


def _unet2d() -> nn.Module:
    from diffusers import UNet2DModel

    model: nn.Module = UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    return model


def _unet2d_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    return {"sample": torch.randn(2, 3, 16, 16, generator=g), "timestep": 10 + 7 * seed}


def _unet2d_condition() -> nn.Module:
    from diffusers import UNet2DConditionModel

    model: nn.Module = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    return model


def _unet2d_condition_inputs(seed: int) -> Inputs:
    g = _generator(seed)
    return {
        "sample": torch.randn(2, 4, 8, 8, generator=g),
        "timestep": torch.tensor([10 + 7 * seed, 500]),
        "encoder_hidden_states": torch.randn(2, 6 + seed, 32, generator=g),
    }


# Known failures (each checked to fail the same way twice). The second call of a token
# model has a new sequence length, so Dynamo recompiles a dynamic-shape graph; with the
# same shapes twice (other values), every entry but gpt_neox and convnext passes at a
# third (checked outside the suite).
ENTRIES: list[Entry] = [
    # --- decoder LMs
    Entry(
        "llama",
        "llama",
        "RMSNorm, rotary embeddings, grouped-query attention, SwiGLU",
        _causal_lm("LlamaConfig", **LM),
        decoder_inputs,
        quick=True,
    ),
    Entry(
        "qwen2",
        "qwen2",
        "biased q/k/v projections, tied embeddings",
        _causal_lm("Qwen2Config", **(LM | {"tie_word_embeddings": True})),
        decoder_inputs,
    ),
    Entry(
        "qwen3",
        "qwen3",
        "RMSNorm on q and k per head, explicit head_dim",
        _causal_lm("Qwen3Config", **LM, head_dim=16),
        decoder_inputs,
    ),
    Entry(
        "mistral",
        "mistral",
        "sliding-window attention (window 4, shorter than the prompts)",
        _causal_lm("MistralConfig", **LM, sliding_window=4),
        decoder_inputs,
    ),
    Entry(
        "gemma2",
        "gemma2",
        "alternating sliding/global layers, logit soft-capping, scaled embeddings",
        _causal_lm("Gemma2Config", **LM, head_dim=16, sliding_window=4, query_pre_attn_scalar=16),
        decoder_inputs,
    ),
    Entry(
        "phi",
        "phi",
        "partial rotary embeddings (partial_rotary_factor 0.5), parallel attention + MLP",
        _causal_lm("PhiConfig", **LM, partial_rotary_factor=0.5),
        decoder_inputs,
    ),
    Entry(
        "gpt_neox",
        "gpt_neox",
        "partial rotary embeddings (rotary_pct 0.25), fused qkv, parallel residual",
        _causal_lm(
            "GPTNeoXConfig",
            **{k: v for k, v in LM.items() if k != "num_key_value_heads"},
            rotary_pct=0.25,
        ),
        decoder_inputs,
    ),
    Entry(
        "gptj",
        "gptj",
        "partial interleaved rotary embeddings (rotary_dim 8 of head 16)",
        _causal_lm(
            "GPTJConfig",
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=LAYERS,
            n_head=4,
            n_positions=128,
            rotary_dim=8,
            bos_token_id=1,
            eos_token_id=2,
        ),
        decoder_inputs,
    ),
    Entry(
        "mixtral",
        "mixtral",
        "mixture of experts (4 experts, top-2 routing, stacked expert weights)",
        _causal_lm(
            "MixtralConfig",
            **(LM | {"intermediate_size": 32}),
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        decoder_inputs,
        quick=True,
    ),
    Entry(
        "qwen2_moe",
        "qwen2_moe",
        "mixture of experts with a gated shared expert",
        _causal_lm(
            "Qwen2MoeConfig",
            **LM,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
        ),
        decoder_inputs,
    ),
    Entry(
        "gpt2",
        "gpt2",
        "learned positions, Conv1D layers, tied embeddings",
        _causal_lm(
            "GPT2Config",
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=LAYERS,
            n_head=4,
            n_positions=128,
            bos_token_id=1,
            eos_token_id=2,
        ),
        decoder_inputs,
    ),
    Entry(
        "opt",
        "opt",
        "offset learned positions, projected word embeddings",
        _causal_lm(
            "OPTConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            max_position_embeddings=128,
            word_embed_proj_dim=32,
        ),
        decoder_inputs,
    ),
    Entry(
        "bloom",
        "bloom",
        # its tied embedding used to be held from the lookup to the head: a third was
        # refused for the 2nd call's dynamic-shape graph (283.5 KiB against 271.3 KiB)
        "ALiBi position biases, fused qkv, tied embeddings",
        _causal_lm("BloomConfig", vocab_size=VOCAB, hidden_size=64, n_layer=LAYERS, n_head=4),
        decoder_inputs,
    ),
    Entry(
        "falcon",
        "falcon",
        "new decoder architecture: grouped KV heads, parallel attention",
        _causal_lm(
            "FalconConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            ffn_hidden_size=128,  # the others' MLP width (its default is 4 x hidden)
            max_position_embeddings=128,
            bos_token_id=1,
            eos_token_id=2,
        ),
        decoder_inputs,
    ),
    Entry(
        "gemma3",
        "gemma3_text",
        "sliding/global layers with a rotary base each, q/k RMSNorm, scaled embeddings",
        _causal_lm(
            "Gemma3TextConfig", **LM, head_dim=16, sliding_window=4, query_pre_attn_scalar=16
        ),
        decoder_inputs,
    ),
    Entry(
        "cohere",
        "cohere",
        "LayerNorm without bias, parallel attention + MLP, interleaved rotary, logit scale",
        _causal_lm("CohereConfig", **LM),
        decoder_inputs,
    ),
    Entry(
        "olmo2",
        "olmo2",
        "norms after attention and MLP (not before), q/k RMSNorm over the projections",
        _causal_lm("Olmo2Config", **LM),
        decoder_inputs,
    ),
    Entry(
        "starcoder2",
        "starcoder2",
        "biased projections, LayerNorm, an ungated GELU MLP",
        _causal_lm("Starcoder2Config", **LM),
        decoder_inputs,
    ),
    Entry(
        "phi3",
        "phi3",
        "fused qkv and fused gate/up projections (split in the graph)",
        _causal_lm("Phi3Config", **LM),
        decoder_inputs,
    ),
    Entry(
        "stablelm",
        "stablelm",
        "partial rotary embeddings (the default factor 0.25), LayerNorm",
        _causal_lm("StableLmConfig", **LM),
        decoder_inputs,
    ),
    Entry(
        "granite",
        "granite",
        "embedding, residual, attention and logit multipliers",
        _causal_lm("GraniteConfig", **LM),
        decoder_inputs,
    ),
    Entry(
        "deepseek_v3",
        "deepseek_v3",
        "multi-head latent attention (low-rank q and kv, split rotary/plain head dims), "
        "routed experts with a shared one after a dense first layer",
        _causal_lm(
            "DeepseekV3Config",
            # latent attention has a key per query head: as many KV heads as heads
            **(LM | {"num_key_value_heads": 4}),
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
        decoder_inputs,
    ),
    Entry(
        "gpt_oss",
        "gpt_oss",
        "attention sinks (a learned logit per head), MoE with a clamped SwiGLU, "
        "sliding/full layers alternating",
        _causal_lm(
            "GptOssConfig",
            **LM,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2),
        ),
        decoder_inputs,
    ),
    Entry(
        "qwen3_moe",
        "qwen3_moe",
        "MoE in every layer (top-k routing over experts of their own width), q/k RMSNorm",
        _causal_lm(
            "Qwen3MoeConfig",
            **LM,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
        ),
        decoder_inputs,
    ),
    Entry(
        "llama4",
        "llama4_text",
        "chunked local attention, layers without rotary embeddings (NoPE), MoE with a shared "
        "expert",
        _causal_lm(
            "Llama4TextConfig",
            **LM,
            head_dim=16,
            intermediate_size_mlp=128,
            num_local_experts=4,
            num_experts_per_tok=1,
            attention_chunk_size=8,
            interleave_moe_layer_step=1,
        ),
        decoder_inputs,
    ),
    Entry(
        "lfm2",
        "lfm2",
        "gated short convolutions (a conv state) between attention layers",
        _causal_lm(
            "Lfm2Config",
            **LM,
            layer_types=["conv", "full_attention"] * (LAYERS // 2),
        ),
        decoder_inputs,
    ),
    Entry(
        "qwen3_next",
        "qwen3_next",
        "gated delta-rule linear attention (chunked, with a causal conv) beside gated full "
        "attention, MoE with a shared expert",
        _causal_lm(
            "Qwen3NextConfig",
            # 12 layers: at 4, a third is under what one linear-attention layer's chunks
            # keep alive (the plan is rightly infeasible)
            **(LM | {"num_hidden_layers": 12}),
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention"] * 6,
        ),
        decoder_inputs,
    ),
    Entry(
        "mamba",
        "mamba",
        "selective state-space layers (the sequential scan), causal depthwise conv; no attention",
        _causal_lm(
            "MambaConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            # 12 layers: at 4, a third of the weights is less than what one layer's scan
            # keeps alive (the plan is rightly infeasible)
            num_hidden_layers=12,
            state_size=8,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        decoder_inputs,
    ),
    Entry(
        "mamba2",
        "mamba2",
        "state-space duality: the scan in chunks (segment sums, cumulative decays), grouped "
        "B and C, a gated RMSNorm",
        _causal_lm(
            "Mamba2Config",
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=12,  # as mamba: a third must exceed one layer's working set
            state_size=8,
            expand=2,
            n_groups=1,
            head_dim=16,
            num_heads=8,
            chunk_size=8,
        ),
        decoder_inputs,
    ),
    Entry(
        "jamba",
        "jamba",
        "hybrid: attention layers between Mamba layers, MoE in every other layer",
        _causal_lm(
            "JambaConfig",
            # 8 layers: at 4, a third is under one layer's working set
            **(LM | {"num_hidden_layers": 8}),
            num_experts=4,
            num_experts_per_tok=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=8,
            mamba_expand=2,
            use_mamba_kernels=False,
        ),
        decoder_inputs,
    ),
    Entry(
        "recurrent_gemma",
        "recurrent_gemma",
        "RG-LRU recurrent blocks (a gated linear recurrence) with local attention between",
        _causal_lm(
            "RecurrentGemmaConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=1,
            lru_width=64,
            attention_window_size=8,
            block_types=["recurrent", "recurrent", "attention"],
        ),
        decoder_inputs,
    ),
    Entry(
        "dory",
        "dory",
        "recurrent depth: a block of layers applied in a loop (3 times), its weights read "
        "at each pass (each streamed weight comes back once per loop), sliding-window layers",
        _causal_lm(
            "DoryConfig",
            **LM,
            head_dim=16,
            n_input_layers=1,
            n_recurrent_layers=2,
            n_output_layers=1,
            n_recurrent_loops=3,
            sliding_window=4,
        ),
        decoder_inputs,
    ),
    Entry(
        "ctrl",
        "ctrl",
        "sinusoidal positions added in the model, an embedding the head shares, graph breaks "
        "that make three frames of a forward; a graph planned beside another frame's, when "
        "that frame's alternative holding copies had dropped them, left them no room",
        _causal_lm(
            "CTRLConfig",
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=LAYERS,
            n_head=4,
            dff=128,
            n_positions=128,
            pad_token_id=0,
        ),
        decoder_inputs,
    ),
    Entry(
        "big_bird",
        "big_bird",
        "a decoder whose block-sparse attention switches itself to full attention at its "
        "first short call (the config changed mid-forward: graph breaks in that call only), "
        "learned positions; loaded plans refused prompts shorter or longer than the saved one "
        "(a replay beside other residents than the saving session's)",
        _causal_lm("BigBirdConfig", **LM, is_decoder=True),
        decoder_inputs,
    ),
    # --- encoder-decoders
    Entry(
        "t5",
        "t5",
        "encoder-decoder, relative position buckets, padded encoder mask",
        _auto(
            "AutoModelForSeq2SeqLM",
            "T5Config",
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
        ),
        seq2seq_inputs,
        quick=True,
    ),
    Entry(
        "bart",
        "bart",
        "encoder-decoder, learned positions, padded encoder mask",
        _auto(
            "AutoModelForSeq2SeqLM",
            "BartConfig",
            vocab_size=VOCAB,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=128,
        ),
        seq2seq_inputs,
    ),
    Entry(
        "whisper",
        "whisper",
        "audio encoder-decoder: conv front end over mel features, sinusoidal positions",
        _auto(
            "AutoModelForSpeechSeq2Seq",
            "WhisperConfig",
            vocab_size=VOCAB,
            num_mel_bins=16,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_source_positions=16,
            max_target_positions=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            begin_suppress_tokens=None,
        ),
        _whisper_inputs,
    ),
    # --- encoders with a padded attention mask
    Entry(
        "bert",
        "bert",
        "encoder with a padded attention mask, token types, MLM head",
        _auto(
            "AutoModelForMaskedLM",
            "BertConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
        ),
        encoder_inputs,
    ),
    Entry(
        "roberta",
        "roberta",
        "encoder with a padded attention mask, positions counted from padding_idx",
        _auto(
            "AutoModelForMaskedLM",
            "RobertaConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=66,
        ),
        encoder_inputs,
    ),
    Entry(
        "distilbert",
        "distilbert",
        "encoder with a padded attention mask, sequence-classification head",
        _auto(
            "AutoModelForSequenceClassification",
            "DistilBertConfig",
            vocab_size=VOCAB,
            dim=64,
            n_layers=LAYERS,
            n_heads=4,
            hidden_dim=128,
            max_position_embeddings=64,
            num_labels=3,
        ),
        encoder_inputs,
    ),
    Entry(
        "deberta_v2",
        "deberta-v2",
        "disentangled attention over relative positions (c2p, p2c), log position buckets",
        _auto(
            "AutoModel",
            "DebertaV2Config",
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
            relative_attention=True,
            position_buckets=16,
            pos_att_type=["p2c", "c2p"],
        ),
        encoder_inputs,
    ),
    Entry(
        "electra",
        "electra",
        "embeddings narrower than the hidden size, projected up",
        _auto(
            "AutoModel",
            "ElectraConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            embedding_size=32,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
        ),
        encoder_inputs,
    ),
    # --- audio
    Entry(
        "modernbert",
        "modernbert",
        "local (sliding) and global attention layers alternating, rotary embeddings, "
        "padding removed inside the model (unpadded tokens, re-padded at the end)",
        _auto(
            "AutoModelForMaskedLM",
            "ModernBertConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
            local_attention=8,
            global_attn_every_n_layers=2,
        ),
        encoder_inputs,
    ),
    Entry(
        "wav2vec2",
        "wav2vec2",
        "conv feature encoder over raw audio, grouped-conv positional embedding",
        _auto(
            "AutoModel",
            "Wav2Vec2Config",
            hidden_size=64,
            num_hidden_layers=8,  # at 4, a third is less than the conv front end needs
            num_attention_heads=4,
            intermediate_size=128,
            conv_dim=(32, 32),
            conv_stride=(5, 4),
            conv_kernel=(10, 4),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
        ),
        audio_inputs,
    ),
    # --- time series
    Entry(
        "patchtst",
        "patchtst",
        "patches of a series, batch norm over the transposed patches (torch's CPU kernel "
        "and its meta function lay the output out differently)",
        _model(
            "PatchTSTForPrediction",
            "PatchTSTConfig",
            num_input_channels=3,
            context_length=16,
            patch_length=4,
            patch_stride=4,
            d_model=256,
            num_hidden_layers=LAYERS,
            prediction_length=4,
            num_parallel_samples=4,
        ),
        _series_inputs,
    ),
    # --- vision
    Entry(
        "vit",
        "vit",
        "vision transformer: patch embedding conv, CLS token, classifier",
        _auto(
            "AutoModelForImageClassification",
            "ViTConfig",
            hidden_size=64,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
            num_labels=5,
        ),
        image_inputs,
    ),
    Entry(
        "convnext",
        "convnext",
        "depthwise convolutions, channels-last LayerNorm, layer scale",
        _auto(
            "AutoModelForImageClassification",
            "ConvNextConfig",
            hidden_sizes=[16, 32, 64, 64],
            depths=[1, 1, 1, 1],
            num_labels=5,
        ),
        image_inputs,
    ),
    Entry(
        "resnet",
        "resnet",
        "BatchNorm in eval mode (running statistics as buffers), residual convs",
        _auto(
            "AutoModelForImageClassification",
            "ResNetConfig",
            embedding_size=16,
            hidden_sizes=[16, 32, 64, 64],
            depths=[1, 1, 1, 1],
            layer_type="basic",
            num_labels=5,
        ),
        image_inputs,
        quick=True,
    ),
    Entry(
        "swin",
        "swin",
        "shifted-window attention with relative position bias, patch merging",
        _auto(
            "AutoModel",
            "SwinConfig",
            image_size=32,
            patch_size=4,
            embed_dim=32,
            depths=[2, 6],  # with [2, 2], a third is less than the largest stage needs
            num_heads=[2, 4],
            window_size=4,
        ),
        image_inputs,
    ),
    Entry(
        "dinov2",
        "dinov2",
        "interpolated position embeddings, layer scale",
        _auto(
            "AutoModel",
            "Dinov2Config",
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=128,
        ),
        image_inputs,
    ),
    # --- text and image
    Entry(
        "clip",
        "clip",
        "two independent towers (text and vision) joined only at the end: the plan may run "
        "their nodes in another order than the trace",
        _auto("AutoModel", "CLIPConfig", text_config=TOWER_TEXT, vision_config=TOWER_VISION),
        text_image_inputs,
    ),
    Entry(
        "siglip",
        "siglip",
        "two towers with a sigmoid loss's logit scale and bias, an attention-pooling head",
        _auto("AutoModel", "SiglipConfig", text_config=TOWER_TEXT, vision_config=TOWER_VISION),
        text_image_inputs,
    ),
    Entry(
        "llava",
        "llava",
        "a vision tower's patch features projected and scattered into an LM's image-token "
        "positions; graph breaks split it into many graphs",
        _seeded(_llava),
        _llava_inputs,
    ),
    # --- diffusers
    Entry(
        "unet2d",
        "diffusers.UNet2DModel",
        "diffusion UNet: timestep embedding, GroupNorm, attention down/up blocks, skips",
        _seeded(_unet2d),
        _unet2d_inputs,
    ),
    Entry(
        "unet2d_condition",
        "diffusers.UNet2DConditionModel",
        "conditional UNet: cross-attention transformer blocks over text states",
        _seeded(_unet2d_condition),
        _unet2d_condition_inputs,
    ),
    Entry(
        "autoencoder_kl",
        "diffusers.AutoencoderKL",
        "VAE: encode to a latent distribution, decode its mode; mid-block attention",
        _diffusers(
            "AutoencoderKL",
            in_channels=3,
            out_channels=3,
            block_out_channels=(32, 64),
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
            latent_channels=4,
            norm_num_groups=8,
            layers_per_block=1,
        ),
        _vae_inputs,
    ),
    Entry(
        "autoencoder_kl_ltx_video",
        "diffusers.AutoencoderKLLTXVideo",
        "video VAE: causal 3D convolutions padded by repeating edge frames, pixel-shuffle "
        "upsampling over time and space (a view of a copy returned beside it)",
        _diffusers(
            "AutoencoderKLLTXVideo",
            in_channels=3,
            out_channels=3,
            latent_channels=8,
            block_out_channels=(16, 16, 32, 32),
            decoder_block_out_channels=(16, 16, 32, 32),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
            spatio_temporal_scaling=(True, True, False, False),
            decoder_spatio_temporal_scaling=(True, True, False, False),
            decoder_inject_noise=(False,) * 5,
            upsample_residual=(False,) * 4,
            upsample_factor=(1,) * 4,
            timestep_conditioning=False,
            patch_size=1,
            patch_size_t=1,
            encoder_causal=True,
            decoder_causal=False,
        ),
        _video_vae_inputs,
    ),
    Entry(
        "sd3_transformer",
        "diffusers.SD3Transformer2DModel",
        "MMDiT: joint text/image attention, adaptive norms on timestep and pooled text, patchify",
        _diffusers(
            "SD3Transformer2DModel",
            sample_size=8,
            patch_size=2,
            in_channels=4,
            num_layers=4,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=32,
            caption_projection_dim=32,
            pooled_projection_dim=32,
            out_channels=4,
            pos_embed_max_size=16,
        ),
        _mmdit_inputs,
    ),
    Entry(
        "flux",
        "diffusers.FluxTransformer2DModel",
        "joint text/image blocks then single-stream blocks, rotary embeddings over 3 axes of "
        "position ids, guidance-free timestep embedding",
        _diffusers(
            "FluxTransformer2DModel",
            patch_size=1,
            in_channels=16,
            num_layers=2,
            num_single_layers=6,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 6, 6),
        ),
        _flux_inputs,
    ),
    Entry(
        "pixart",
        "diffusers.PixArtTransformer2DModel",
        "DiT with adaLN-single (one timestep projection shared by every block), caption "
        "projection, cross-attention",
        _diffusers(
            "PixArtTransformer2DModel",
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=4,
            out_channels=8,
            num_layers=8,
            cross_attention_dim=32,
            sample_size=8,
            patch_size=2,
            caption_channels=24,
            norm_type="ada_norm_single",
            use_additional_conditions=False,
        ),
        _pixart_inputs,
    ),
    Entry(
        "wan",
        "diffusers.WanTransformer3DModel",
        "video DiT: 3D patches, rotary embeddings over frames, height and width, "
        "cross-attention to text",
        _diffusers(
            "WanTransformer3DModel",
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=4,
            out_channels=4,
            text_dim=32,
            freq_dim=32,
            ffn_dim=64,
            num_layers=6,
            rope_max_seq_len=32,
        ),
        _wan_inputs,
    ),
    Entry(
        "sana",
        "diffusers.SanaTransformer2DModel",
        "linear attention (ReLU kernels, no softmax), convolutional Mix-FFN",
        _diffusers(
            "SanaTransformer2DModel",
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=16,
            # 12 layers: at 6, a third is under one block and its working set
            num_layers=12,
            num_cross_attention_heads=2,
            cross_attention_head_dim=16,
            cross_attention_dim=32,
            caption_channels=32,
            sample_size=8,
            patch_size=1,
        ),
        _sana_inputs,
    ),
    Entry(
        "qwenimage",
        "diffusers.QwenImageTransformer2DModel",
        "MMDiT with complex rotary embeddings over the image's frame, height and width, a text "
        "mask",
        _diffusers(
            "QwenImageTransformer2DModel",
            patch_size=1,
            in_channels=16,
            out_channels=16,
            # 16 layers: its rotary tables (buffers, 512 KiB) stay resident, so a third of
            # fewer layers' weights is under what one block needs beside them
            num_layers=16,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(4, 6, 6),
        ),
        _qwenimage_inputs,
    ),
]

BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}
assert len(BY_NAME) == len(ENTRIES), "entry names are unique"

BUDGETS = ("none", "third")

# the entries also run in bfloat16 (weights and floating inputs), as most large models are
# run: a decoder LM, an encoder-decoder, an MMDiT and a UNet
BFLOAT16_MODELS = ("llama", "t5", "flux", "unet2d_condition")

# called under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (weights in float32, the ops
# autocast lists run in bfloat16), as mixed precision is mostly run: the casts are in the
# traced graph, and a plain call afterwards is compiled apart (Dynamo guards on autocast)
AUTOCAST_MODELS = ("llama", "t5", "flux")

# with the options' defaults (Inductor compiles the host's segments, and the faster of it
# and eager is kept by timing both at compile time), where the other tests run eager
DEFAULT_COMPILER_MODELS = ("llama", "gpt2", "t5", "bert", "mamba", "flux", "unet2d_condition")

# the convolution models also run in ``channels_last`` (as diffusers' and torchvision's
# guides advise on GPUs): their 4-D weights are dense but not row-major
CHANNELS_LAST_MODELS = ("resnet", "convnext", "unet2d_condition", "autoencoder_kl")

# run asking for every layer's hidden states and attention maps too (``output_attentions``
# makes each layer break the graph: every layer calls one frame's graphs with its weights)
EVERY_OUTPUT_MODELS = ("llama", "t5", "bert")

# generate(): the families it runs on (decoder-only, then encoder-decoder: the encoder
# runs once outside forward, each step's forward is the decoder's), and its known failures
# (name, cache implementation, budget) -> reason
GENERATE_MODELS = (
    "llama",
    "qwen3",
    "phi",
    "gemma3",
    "granite",
    "deepseek_v3",
    "dory",
    "big_bird",
    "t5",
    "bart",
)
GENERATE_XFAIL: dict[tuple[str, str, str], str] = {}

# used several ways in one process (forward, with labels, generate(), every layer's
# attention maps): a later graph must not be refused for the room an earlier one keeps
SEVERAL_WAYS_MODELS = ("llama", "gpt2", "gemma3", "t5")
