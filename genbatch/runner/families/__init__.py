"""Model families: the per-family steps of a diffusers pipeline, for genbatch's own denoise loop."""

from genbatch.runner.families.base import COND, UNCOND, Conditioning, Family, Trajectory, to_uint8
from genbatch.runner.families.flux import FluxFamily
from genbatch.runner.families.sd3 import SD3Family
from genbatch.runner.families.wan import WanFamily

FAMILIES: dict[str, Family] = {"wan": WanFamily(), "flux": FluxFamily(), "sd3": SD3Family()}


def family_of(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"no denoise loop for model family {name!r}; genbatch runs {sorted(FAMILIES)}") from None


__all__ = ["COND", "UNCOND", "Conditioning", "FAMILIES", "Family", "Trajectory", "family_of", "to_uint8"]
