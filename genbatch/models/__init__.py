"""One module per model family: spec reading, denoise hooks, blocks and attention streams, sequence-parallel
split points, VAE decode rules, tiny presets and planner shape facts.

The API a family module is written against (`genbatch/models/wan.py` is the model to copy):
- `base.ModelFamily`: the one record a family module builds, as `FAMILY`; its fields say which layer reads
  them. With it: `Blocks` (before / repeated / after), `AttentionSite` (pattern, `SELF`/`JOINT`/`CROSS`,
  streams), `TransformerParts` (blocks, attention, `SequenceSplits` with its `Split` / `Gather` points, and
  the empty room for the tensor-parallel splits, compile units and stage boundaries), `TinyPreset` (configs from `tiny_configs`,
  defaults, a `build(meta)` function), the text encoders' blocks (`T5_ENCODER`, `CLIP_TEXT_ENCODER`,
  `CLIP_TEXT_ENCODER_WITH_PROJECTION`), and `transformer_spec` for `read_spec`.
- `hooks`: the `FamilyHooks` protocol the denoise hooks implement (encode, trajectory, predict, combine,
  vae_input, postprocess), with `Conditioning`, `Trajectory`, `COND` / `UNCOND`, `classifier_free_guidance`.
- `shapes.ModelShape`: a published model as the planner sees it (`ModelFamily.published`).
- `vae_rules`: decoder class -> rule kind tables (`AUTOENCODER_KL`, `AUTOENCODER_KL_WAN`).
- `tiny`: what tiny presets are built from (an in-memory tokenizer, small T5 / CLIP configs, `placed`).
Adding a family is its module, one line in `registry.FAMILY_MODULES`, and its tests; or, from an installed
package, an entry point in the group `genbatch.families` (`registry.ENTRY_POINT_GROUP`).

Lookups: `family(name)`, `families()`, `family_for_pipeline(class_name)`, `presets()`, `published()`;
`resolve_model(name)` resolves a preset, a pipeline directory, or a published model or hub id in the Hugging Face
cache to its `genbatch.models.spec.ModelSpec`, once per name (`resolve_model_or_published` also a published model
not in the cache, from its published configs). Nothing in this package imports torch at module level (`gen validate` and `gen plan` stay torch-free),
and it imports only `genbatch.io` and `genbatch.jobs` from the rest of genbatch.
"""

from genbatch.models.spec import ModelSpec, UnknownModelError
from genbatch.models.base import ModelFamily
from genbatch.models.registry import families, family, family_for_pipeline, presets, published
from genbatch.models.resolve import (ModelNotCached, known_names, model_directory, model_hub_id, preset_names,
                                     published_model, published_spec, resolve_model, resolve_model_or_published)

__all__ = [
    "ModelFamily",
    "ModelNotCached",
    "ModelSpec",
    "UnknownModelError",
    "families",
    "family",
    "family_for_pipeline",
    "known_names",
    "model_directory",
    "model_hub_id",
    "preset_names",
    "presets",
    "published",
    "published_model",
    "published_spec",
    "resolve_model",
    "resolve_model_or_published",
]
