"""A diffusers pipeline given compiled modules, as its users compile them: the UNet
replaced by ``tt.compile(pipe.unet)``, the VAE's ``decode`` by ``torch.compile``. The
pipeline reads the UNet's ``config``, ``device`` and ``dtype`` and calls it once per step
(with the unconditional and conditional halves in one batch); the images match eager's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import tensortorrent as tt

from .harness import param_bytes
from .models import BY_NAME

FAST_VIRTUAL = {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}


def _pipeline() -> Any:
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline

    unet = BY_NAME["unet2d_condition"].build()
    torch.manual_seed(1)
    vae = AutoencoderKL(
        block_out_channels=[32, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        norm_num_groups=8,
    ).eval()
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _images(pipe: Any, guidance: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    prompt, negative = torch.randn(2, 1, 6, 32, generator=g)
    images: torch.Tensor = pipe(
        prompt_embeds=prompt,
        negative_prompt_embeds=negative,
        num_inference_steps=3,
        height=32,
        width=32,
        guidance_scale=guidance,
        output_type="pt",
        generator=torch.Generator().manual_seed(3),
    ).images
    return images


def _options(budget: str, model: torch.nn.Module, where: Path) -> dict[str, Any]:
    """Half the module's parameters' bytes on the virtual device, or in RAM with the rest
    on disk (a third leaves no room for a step's batch of two beside its largest weights)."""
    half = param_bytes(model) // 2
    if budget == "disk":
        return {"budgets": {"cpu": half}, "offload_dir": str(where), "compiler": "eager"}
    return {
        "budgets": {"virtual:0": half},
        "virtual_devices": {"virtual:0": FAST_VIRTUAL},
        "devices": ["virtual:0"],
        "compiler": "eager",
    }


@pytest.mark.parametrize("budget", ["half", pytest.param("disk", marks=pytest.mark.corpus_full)])
@pytest.mark.corpus
# the scheduler's own (numpy 2 and the scheduler's timesteps), in eager as in compiled runs
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
def test_a_pipeline_with_compiled_modules_matches_eager(budget: str, tmp_path: Path) -> None:
    reference = _pipeline()
    with torch.no_grad():
        expected = [_images(reference, guidance) for guidance in (5.0, 1.0)]
    pipe = _pipeline()
    unet = tt.compile(pipe.unet, **_options(budget, pipe.unet, tmp_path / "unet"))
    pipe.unet = unet
    vae = pipe.vae
    vae.decode = torch.compile(
        vae.decode, backend="tensortorrent", options=_options(budget, vae, tmp_path / "vae")
    )
    assert unet.config.in_channels == 4 and unet.dtype == torch.float32
    with torch.no_grad():
        for guidance, want in zip((5.0, 1.0), expected, strict=True):
            torch.testing.assert_close(_images(pipe, guidance), want, msg=f"guidance {guidance}")
    assert unet.graphs and "Graph 0" in unet.explain()
