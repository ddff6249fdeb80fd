"""The models TeaCache covers: those with published rescaling coefficients, recognised by their transformer config.

The coefficients live in each family's record (`ModelFamily.teacache`, in its module); `COVERED` gathers them.

TeaCache (`teacache:THRESHOLD`) turns the relative L1 change of the first block's timestep-modulated input
into an estimate of the output's change through a degree-4 polynomial fitted per model. The coefficients
are the reference implementation's (ali-vilab/TeaCache: `TeaCache4Wan2.1/teacache_generate.py`, its
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

from genbatch.models.base import TeaCacheModel
from genbatch.models.registry import families

COVERED: tuple[TeaCacheModel, ...] = tuple(model for family in families().values() for model in family.teacache)
"""The covered models, every family's. Tests that run the mechanism on tiny models add an entry of their own for
the test's duration (a tiny model has no published coefficients, so the tool never accepts one)."""


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
