"""The models TeaCache covers: those with published rescaling coefficients, recognised by their transformer config.

TeaCache (`teacache:THRESHOLD`) turns the relative L1 change of the first block's timestep-modulated input
into an estimate of the output's change through a degree-4 polynomial fitted per model. The coefficients
below are the reference implementation's (ali-vilab/TeaCache: `TeaCache4Wan2.1/teacache_generate.py`, its
retention-step set, fitted on the 6 x dim timestep projection diffusers' Wan blocks take as `temb`; and
`TeaCache4FLUX/teacache_flux.py`, fitted on block 0's `norm1` output). A model is recognised by its
transformer class and the config values that tell it from its siblings (FLUX.1-schnell has no guidance
embedding, Wan 2.1 I2V an image projection); a pipeline with a second expert (Wan 2.2 A14B) has no published
set for its experts and is not covered. Any other model is refused with `not_covered`'s message: a polynomial
fitted on one model says nothing about another.

Pure data (no torch): the start-up check reads it from config files, the job's hooks from the loaded model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class TeaCacheModel:
    """One model TeaCache runs on, with its published coefficients."""

    name: str
    """The model as users know it (`Wan 2.1 T2V 1.3B`): what messages name."""
    transformer: str
    """The diffusers transformer class (`WanTransformer3DModel`)."""
    config: tuple[tuple[str, object], ...]
    """(key, value) pairs of the transformer config that identify the model (None: the key is absent or null)."""
    coefficients: tuple[float, ...]
    """The rescaling polynomial, highest degree first (numpy's `poly1d` order): 5 values for degree 4."""
    warmup_steps: int
    """Steps at the start that always compute (the reference's retention steps); the last step always computes."""

    def matches(self, transformer: str, config: Mapping[str, object]) -> bool:
        """Whether a transformer of class `transformer` with `config` is this model."""
        return transformer == self.transformer and all(config.get(key) == value for key, value in self.config)

    def rescale(self, change: float) -> float:
        """The polynomial at `change` (Horner's rule, highest degree first)."""
        value = 0.0
        for coefficient in self.coefficients:
            value = value * change + coefficient
        return value


_WAN = "WanTransformer3DModel"
COVERED: tuple[TeaCacheModel, ...] = (
    TeaCacheModel(
        name="Wan 2.1 T2V 1.3B", transformer=_WAN,
        config=(("num_layers", 30), ("num_attention_heads", 12), ("attention_head_dim", 128), ("ffn_dim", 8960),
                ("in_channels", 16), ("image_dim", None)),
        coefficients=(-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02),
        warmup_steps=5,
    ),
    TeaCacheModel(
        name="Wan 2.1 T2V 14B", transformer=_WAN,
        config=(("num_layers", 40), ("num_attention_heads", 40), ("attention_head_dim", 128), ("ffn_dim", 13824),
                ("in_channels", 16), ("image_dim", None)),
        coefficients=(-3.03318725e05, 4.90537029e04, -2.65530556e03, 5.87365115e01, -3.15583525e-01),
        warmup_steps=5,
    ),
    TeaCacheModel(
        name="FLUX.1-dev", transformer="FluxTransformer2DModel",
        config=(("num_layers", 19), ("num_single_layers", 38), ("num_attention_heads", 24),
                ("attention_head_dim", 128), ("in_channels", 64), ("guidance_embeds", True)),
        coefficients=(4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01),
        warmup_steps=1,
    ),
)
"""The covered models. Tests that run the mechanism on tiny models add an entry of their own for the test's
duration (a tiny model has no published coefficients, so the tool never accepts one)."""


def covered_model(transformer: str, config: Mapping[str, object], experts: int = 1) -> TeaCacheModel | None:
    """The covered model a denoiser of class `transformer` with `config` is (None: not covered). `experts`:
    the pipeline's denoisers (2 for Wan 2.2 A14B, which no published set covers)."""
    if experts != 1:
        return None
    return next((model for model in COVERED if model.matches(transformer, config)), None)


def not_covered(model: str) -> str:
    """Why `model` cannot run TeaCache, naming the covered models and the modes that run on it."""
    names = ", ".join(covered.name for covered in COVERED)
    return (f"teacache needs coefficients published for the model, and {model} has none; TeaCache covers "
            f"{names}. Run {model} with --cache none, fbc:THRESHOLD or taylorseer:INTERVAL")
