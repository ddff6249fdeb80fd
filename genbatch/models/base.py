"""The record a model family fills in: everything genbatch knows about one family, as data plus its hooks.

A family module (`genbatch/models/wan.py`, ...) builds one `ModelFamily` named `FAMILY` and is listed once in
`genbatch.models.registry`. Nothing here imports torch: specs, shapes and parts are plain data, and the
family's denoise hooks (`ModelFamily.hooks`, see `genbatch.models.hooks`) import torch and diffusers inside
their methods, so `gen validate` and `gen plan` read a family without loading either.

What each field is for, by reader:
- spec resolution (`genbatch.models.resolve`): `pipelines`, `call_defaults`, `read_spec`, `presets`;
- the denoise loop (`genbatch.runner`): `hooks`;
- FSDP per block, compile units and stage splits (`genbatch.parallel`): `transformers[cls].blocks`,
  `text_encoders`;
- sequence parallel (`genbatch.parallel.routing`): `transformers[cls].attention` and `transformers[cls].sequence`;
- tensor parallel (`genbatch.parallel.tensor`): `transformers[cls].tensor_splits`;
- patch-parallel VAE decode (`genbatch.parallel.vae`): `vae_classes`, `vae_rules`;
- the planner (`genbatch.planner`): `published` (and the spec itself for presets and directories), `vae_costs`;
- step caching (`genbatch.parallel.cache`): `teacache`, the models with published TeaCache coefficients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genbatch.models.spec import ModelSpec

if TYPE_CHECKING:
    from genbatch.models.hooks import FamilyHooks
    from genbatch.models.shapes import ImageEncode, Published
    from genbatch.models.vae_costs import VaeCosts

ReadSpec = Callable[[str, Mapping[str, Any], Mapping[str, Any], "Mapping[str, float | int] | None", "str | None"],
                    ModelSpec]
"""read_spec(name, transformer_config, vae_config, defaults, path) -> ModelSpec. `defaults` is None for a
pipeline directory (the family's `call_defaults` apply, with sizes derived from the config where the
pipeline derives them), or a preset's own defaults."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Blocks:
    """A module's forward, cut where per-block work (FSDP units, compile units, stages) can cut it."""

    before: tuple[str, ...] = ()
    """Submodules run once before the repeated blocks (embeddings, projections), in forward order."""
    repeated: tuple[str, ...] = ()
    """Dotted paths of the `ModuleList`s of repeated blocks, in forward order (e.g. `("blocks",)`)."""
    after: tuple[str, ...] = ()
    """Submodules run once after the repeated blocks (final norm, output projection), in forward order."""


SELF = "self"
"""An attention module over one split stream's tokens."""
JOINT = "joint"
"""An attention module over several streams' tokens concatenated (MMDiT text + image)."""
CROSS = "cross"
"""Cross-attention from split queries to replicated keys/values (text): needs no communication."""
SPLIT_KEYS = "split_keys"
"""Attention from queries every rank holds whole (a stream the split points leave unsplit: LTX-2's audio) to the keys of
split streams (LTX-2's video-to-audio attention): each rank attends to its own keys and the partial results merge
on their log-sum-exp over the sequence group, whatever the run's attention strategy."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionSite:
    """The attention modules matching one name pattern, and the token streams they see."""

    pattern: str
    """Glob over the module's `named_modules()` names, e.g. `"blocks.*.attn1"`."""
    kind: str
    """`SELF`, `JOINT`, `CROSS` or `SPLIT_KEYS`."""
    streams: tuple[str, ...]
    """The split streams whose tokens make up the attended sequence, in the order the module concatenates
    them: an input's name (`"hidden_states"`) or `"<module>:<output index>"` for a split module output.
    Empty for `CROSS` (its keys are replicated)."""
    masked: bool = False
    """True when the module's attention carries a key-padding mask (padded text tokens): kernels that take
    no mask (flash, flash-attn, cuDNN here) are refused at start-up for the model."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """A split point: the value is cut along `dim` into the sequence group's shards (diffusers'
    `ContextParallelInput`)."""

    dim: int
    """The sequence dimension."""
    expected_dims: int
    """The value's rank (a value of another rank is left whole)."""
    output: bool = False
    """True: split the module's output (keyed by output index); False: split the module's input (keyed by
    argument name) before its forward."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Gather:
    """A gather point: the module's output is brought back to full length along `dim` (diffusers'
    `ContextParallelOutput`)."""

    dim: int
    """The sequence dimension."""
    expected_dims: int
    """The output's rank."""


@dataclass(frozen=True, kw_only=True, slots=True)
class KeptPrefix:
    """Sequence parallelism for a transformer whose blocks take [prefix, output] with the prefix attended
    block-causally and, on later steps, read from a key/value cache (Qwen-Image 2.1): the output's tokens are split
    and the prefix stays whole on every rank (`genbatch.parallel.kept_prefix`). Each block's attention makes its
    prefix's calls over the prefix alone (run locally, as on one process), and one call from the output's queries
    over [prefix keys, output keys] (`genbatch.parallel.attention.prefix`)."""

    blocks: str
    """The ModuleList of blocks: the first block's `hidden_states` is cut, the last block's output gathered."""
    token_inputs: tuple[str, ...]
    """Per-token inputs of every block, cut like the hidden states along their first dim (rotary tables,
    per-token modulation masks); a None is left alone."""
    prefix_length: Callable[[Mapping[str, Any]], int]
    """A block's keyword inputs -> how many of its hidden states' tokens are the prefix (0 when the hidden states
    hold the output's alone, the prefix read from the cache)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SequenceSplits:
    """Where sequence parallelism splits and gathers a transformer; the attention modules it routes and their
    streams are the class's `AttentionSite`s (all but `CROSS`)."""

    points: Mapping[str, Mapping[str | int, Split] | Gather] = field(default_factory=dict)
    """Module name (or glob, e.g. `transformer_blocks.*`) -> its split points by input name or output index,
    or its gather point. Empty: the model's own diffusers `_cp_plan`."""
    output_stream: str = "hidden_states"
    """The stream the gather points bring back to full length."""
    text_streams: tuple[str, ...] = ()
    """The split streams of text tokens: they stay whole in a PipeFusion patch forward (the image streams keep
    the patch's tokens)."""
    strategy: Mapping[str, str] = field(default_factory=dict)
    """Attention module glob -> the attention strategy it uses (`genbatch.parallel.attention.strategy`);
    modules not listed use `exact`."""
    kept_prefix: KeptPrefix | None = None
    """Set for a block-causal transformer with a cached prefix: `points` stay empty, and the output's tokens are
    split after the prefix instead."""


COLWISE = "colwise"
"""Tensor parallel: a Linear's output features split over tp (its input whole), output left split."""
ROWWISE = "rowwise"
"""A Linear's input features split over tp; the partial outputs are all-reduced (one all-reduce of [N, d])."""
PACKED_ROWWISE = "packed_rowwise"
"""`ROWWISE` for a Linear whose input concatenates several column-split streams (FLUX's single-stream
`proj_out`: [attention, MLP]): each stream's columns split apart (blocks from its `_tp_packed_row_blocks`)."""
PACKED_COLWISE = "packed_colwise"
"""`COLWISE` for a Linear whose output packs several streams side by side (FLUX.2's fused [q, k, v, MLP gate, MLP
up] projection of a single-stream block, its gated MLPs' [gate, up]): each packed block's rows split apart, so every
rank keeps its share of each (blocks from its `_tp_packed_col_blocks`, else two equal halves)."""
GATHERED_COLWISE = "colwise_gathered"
"""`COLWISE`, then the small output all-gathered back whole (the AdaLN modulation's (B, 6d))."""
HEADS = "heads"
"""An attention module whose `heads` is divided by tp (its q, k, v are column-split by whole heads)."""
NORM_ACROSS_HEADS = "rms_norm_across_heads"
"""An RMSNorm over all heads' channels (Wan's QK norm): its weight split over tp and its mean square
all-reduced, or the output is silently wrong."""
HEAD_CHANNELS = "head_channels"
"""A module without weights whose outputs span every head's channels (LTX-2's rotary tables, (b, s, heads x d) or,
split-type, (b, heads, s, d/2)): each rank keeps its own heads' share of each output, as the split q and k hold
their heads (no communication)."""
TENSOR_STYLES = (COLWISE, ROWWISE, PACKED_COLWISE, PACKED_ROWWISE, GATHERED_COLWISE, HEADS, NORM_ACROSS_HEADS,
                 HEAD_CHANNELS)


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorSplits:
    """Where tensor parallelism splits a transformer, as data (diffusers' `_tp_plan` is the model)."""

    styles: Mapping[str, str] = field(default_factory=dict)
    """Module name glob (`blocks.*.attn1.to_q`) -> one of `TENSOR_STYLES`; added to (and overriding) the
    model's own `_tp_plan` when `from_diffusers`."""
    from_diffusers: bool = False
    """True: start from the class's diffusers `_tp_plan` (FLUX, Qwen-Image), whose AdaLN modulation stays
    replicated until `styles` shards it."""
    all_reduces: Mapping[str, int] = field(default_factory=dict)
    """Repeated-block list (`Blocks.repeated`) -> all-reduces of [tokens, d] one block does (the attention
    output and the MLP output: 2, seed 000's standard case; Wan's cross-attention makes 3, a FLUX single-stream
    block 1). Joint blocks all-reduce both streams, so their tokens are text plus image."""
    text_free_last_block: bool = False
    """True when the last block of the first repeated list all-reduces the image stream alone (SD3's
    `context_pre_only` block has no text output projection or text MLP)."""

    def all_reduces_per_forward(self, blocks: Mapping[str, int]) -> int:
        """A, all-reduces of [tokens, d] one forward does: `all_reduces` summed over the blocks (`blocks`: each
        repeated list's length). The one per-model formula the runner's accounting and the planner share."""
        return sum(count * blocks.get(name, 0) for name, count in self.all_reduces.items())

    def all_reduces_per_layer(self, blocks: Mapping[str, int]) -> float:
        """A over the number of blocks (what the planner charges each layer: `ModelShape.tp_all_reduces`)."""
        return self.all_reduces_per_forward(blocks) / max(sum(blocks.values()), 1)


def dual_stream_styles(blocks: str) -> dict[str, str]:
    """The tensor styles of a list of dual-stream (MMDiT) blocks under diffusers' names (SD3's, HunyuanVideo's):
    q, k, v of both streams split by heads, both output projections and both MLPs row-wise, both AdaLN
    modulations gathered."""
    attn = f"{blocks}.*.attn"
    projections = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")
    return {**{f"{attn}.{name}": COLWISE for name in projections},
            f"{attn}.to_out.0": ROWWISE, f"{attn}.to_add_out": ROWWISE, attn: HEADS,
            **{f"{blocks}.*.{mlp}.net.0.proj": COLWISE for mlp in ("ff", "ff_context")},
            **{f"{blocks}.*.{mlp}.net.2": ROWWISE for mlp in ("ff", "ff_context")},
            f"{blocks}.*.norm1.linear": GATHERED_COLWISE, f"{blocks}.*.norm1_context.linear": GATHERED_COLWISE}


def single_stream_styles(blocks: str) -> dict[str, str]:
    """The tensor styles of a list of single-stream blocks (attention and MLP side by side, one fused output
    projection over [attention, MLP]: HunyuanVideo's, as diffusers' FLUX `_tp_plan` splits FLUX's)."""
    attn = f"{blocks}.*.attn"
    return {**{f"{attn}.{name}": COLWISE for name in ("to_q", "to_k", "to_v")}, attn: HEADS,
            f"{blocks}.*.proj_mlp": COLWISE, f"{blocks}.*.proj_out": PACKED_ROWWISE,
            f"{blocks}.*.norm.linear": GATHERED_COLWISE}


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformerParts:
    """One denoising transformer class: its blocks, its attention, and where each parallel method splits it."""

    blocks: Blocks
    """Before / repeated / after."""
    attention: tuple[AttentionSite, ...]
    """Every attention module of the class, with the streams it sees."""
    sequence: SequenceSplits | None = None
    """Its sequence-parallel split/gather points (None: no sequence parallelism for this class)."""
    tensor_splits: TensorSplits | None = None
    """Its tensor-parallel splits (None: no tensor parallelism for this class; `--tp` above 1 exits 2)."""
    compile_units: tuple[str, ...] = ()
    """Module name globs, matched part by part (`blocks.*` is each block, not its submodules), whose `forward`
    `--compile` compiles one unit each (`genbatch.parallel.compile`): the repeated blocks. Empty: the class is
    not compiled."""
    carried: tuple[str, ...] = ()
    """PipeFusion: what one repeated block hands the next, in the order of its output (a tensor: one name; a
    tuple: one name per item), each the name of the next block's input it becomes: `("hidden_states",)` for
    Wan, `("encoder_hidden_states", "hidden_states")` for the MMDiT blocks. A stage sends these after its last
    block and the next stage puts them in place of its first block's inputs. Empty: no pipeline stages for
    this class (`--pipefusion` above 1 exits 2)."""
    list_carried: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """PipeFusion: what the blocks of a repeated list hand the next where that is not `carried`, by list (FLUX.2's
    single-stream blocks hand on one tensor, `("hidden_states",)`: the text and image tokens joined). Where a stage
    boundary falls between a list carrying several streams and one carrying one, the earlier list's streams are
    joined along the sequence (dim 1) in their order, as the model joins them between the two lists."""
    cache_lists: tuple[str, ...] = ()
    """The repeated lists the step caches (First-Block Cache, TaylorSeer, TeaCache) span, in forward order; empty:
    all of `blocks.repeated`. A span whose first and last blocks hand on differently shaped outputs (FLUX.2's
    dual-stream blocks two streams, its single-stream ones one joined tensor) has no one residual, so such a model
    names the lists whose blocks agree."""

    def carried_by(self, repeated: str) -> tuple[str, ...]:
        """What a block of the repeated list `repeated` hands the next (`list_carried`, else `carried`)."""
        return tuple(self.list_carried.get(repeated, self.carried))


@dataclass(frozen=True, kw_only=True, slots=True)
class TeaCacheModel:
    """One model TeaCache runs on, with its published coefficients (`ModelFamily.teacache`): the reference
    implementation's (ali-vilab/TeaCache), fitted per model on the first block's timestep-modulated input."""

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


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyPreset:
    """A built-in tiny model of the family: real diffusers classes, small configs, seeded random weights."""

    name: str
    """The preset's name (`tiny-wan`), used as `--model` or a manifest's `model` value."""
    transformer: Mapping[str, Any]
    """The transformer's config (from `genbatch.models.tiny_configs`)."""
    vae: Mapping[str, Any]
    """The VAE's config."""
    defaults: Mapping[str, float | int]
    """Per-job defaults, small enough to run in seconds on a CPU."""
    build: Callable[[frozenset[str]], Any]
    """build(meta) -> the whole diffusers pipeline on the CPU in fp32, components named in `meta` on the
    meta device. The same call always gives the same weights. Imports torch when called."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelFamily:
    """Everything genbatch knows about one model family."""

    name: str
    """The family's name, e.g. `wan` (`ModelSpec.family`)."""
    pipelines: tuple[str, ...]
    """The diffusers pipeline class names (`model_index.json`'s `_class_name`) this family runs."""
    call_defaults: Mapping[str, float | int | None]
    """The defaults of the pipeline's `__call__` (None: derived from the model's config)."""
    read_spec: ReadSpec
    """Builds a `ModelSpec` from the transformer's and VAE's configs."""
    hooks: FamilyHooks
    """The denoise hooks: encode, trajectory (noise and scheduler), predict, combine, VAE input, postprocess."""
    transformers: Mapping[str, TransformerParts]
    """Transformer class name -> its parts (the denoising components, e.g. Wan 2.2's two experts)."""
    denoisers: tuple[str, ...] = ("transformer",)
    """Pipeline components that run the denoising forward."""
    text_encoders: Mapping[str, Blocks] = field(default_factory=dict)
    """Text encoder class name -> its blocks (FSDP shards them per block too)."""
    text_encoder_splits: Mapping[str, TensorSplits] = field(default_factory=dict)
    """Text encoder class name -> its tensor splits (`--text-encoder-parallel tp`); a class without one stays whole."""
    vae_classes: tuple[str, ...] = ()
    """Qualified names (`module:Class`) of the VAE classes patch-parallel decode covers; empty: the VAE
    decodes on one rank."""
    vae_rules: Mapping[str, str] = field(default_factory=dict)
    """Qualified decoder module class name -> rule kind (`genbatch.models.vae_rules`); the rules
    themselves are implemented in `genbatch.parallel.vae`."""
    vae_costs: VaeCosts | None = None
    """Its VAE's decode and encode costs, as the planner prices them (`genbatch.models.vae_costs`); None: priced as
    Wan's VAE for video, the image VAE for images."""
    presets: tuple[TinyPreset, ...] = ()
    """The family's tiny presets."""
    published: tuple[Published, ...] = ()
    """Published models of the family: names, hub ids and configs (`gen plan flux.1-dev`, `gen models`)."""
    teacache: tuple[TeaCacheModel, ...] = ()
    """The family's models with published TeaCache coefficients (`--cache teacache:THRESHOLD` runs on these
    only: `genbatch.models.teacache`)."""
    image_encode: ImageEncode | None = None
    """How the family's rows feed an image to the VAE encoder, as its pipeline does (the planner prices the
    encode); None: its rows start from noise alone."""

    def transformer_parts(self, class_name: str) -> TransformerParts:
        """The parts of one of the family's transformer classes; ValueError naming the known ones."""
        try:
            return self.transformers[class_name]
        except KeyError:
            raise ValueError(
                f"{class_name} is not a transformer of the {self.name} family (it has {sorted(self.transformers)}); "
                "add its TransformerParts to the family module"
            ) from None

    def masks_attention(self) -> bool:
        """True when some transformer of the family attends with a key-padding mask (`AttentionSite.masked`)."""
        return any(site.masked for parts in self.transformers.values() for site in parts.attention)


def encoder_styles(layers: str, attention: str, projections: tuple[str, str, str, str], mlp: str,
                   mlp_in: tuple[str, ...], mlp_out: str) -> dict[str, str]:
    """The tensor styles of a text encoder's layers (`layers.*`): q, k, v column-wise and the output projection
    row-wise in `attention`, the MLP's input Linears column-wise and its output row-wise."""
    q, k, v, out = projections
    attn = f"{layers}.*.{attention}"
    return {**{f"{attn}.{name}": COLWISE for name in (q, k, v)}, f"{attn}.{out}": ROWWISE, attn: HEADS,
            **{f"{layers}.*.{mlp}.{name}": COLWISE for name in mlp_in}, f"{layers}.*.{mlp}.{mlp_out}": ROWWISE}


T5_ENCODER = Blocks(before=("shared",), repeated=("encoder.block",), after=("encoder.final_layer_norm",))
"""A T5 / UMT5 text encoder (`T5EncoderModel`, `UMT5EncoderModel`)."""
CLIP_TEXT_ENCODER = Blocks(before=("embeddings",), repeated=("encoder.layers",), after=("final_layer_norm",))
"""A CLIP text encoder, `CLIPTextModel` (transformers 5 holds its layers directly)."""
CLIP_TEXT_ENCODER_WITH_PROJECTION = Blocks(before=("text_model.embeddings",), repeated=("text_model.encoder.layers",),
                                           after=("text_model.final_layer_norm", "text_projection"))
"""A CLIP text encoder with its projection, `CLIPTextModelWithProjection` (SD3's)."""

T5_TENSOR_SPLITS = TensorSplits(styles={
    **encoder_styles("encoder.block", "layer.0.SelfAttention", ("q", "k", "v", "o"), "layer.1.DenseReluDense",
                     ("wi", "wi_0", "wi_1"), "wo"),
    # the relative position bias has one column per head: each rank keeps its heads' columns
    "encoder.block.*.layer.0.SelfAttention.relative_attention_bias": COLWISE,
})
"""A T5 / UMT5 encoder split over the job group (`--text-encoder-parallel tp`): heads, the gated or plain MLP."""
CLIP_TENSOR_SPLITS = TensorSplits(styles=encoder_styles("encoder.layers", "self_attn", ("q_proj", "k_proj", "v_proj",
                                                                                   "out_proj"), "mlp", ("fc1",), "fc2"))
"""A CLIP text encoder (`CLIPTextModel`) split over the job group."""
CLIP_WITH_PROJECTION_TENSOR_SPLITS = TensorSplits(styles={f"text_model.{name}": style
                                                      for name, style in CLIP_TENSOR_SPLITS.styles.items()})
"""`CLIPTextModelWithProjection` (SD3's): the same layers under `text_model`."""


def decoder_tensor_splits(layers: str) -> TensorSplits:
    """A Llama-style decoder's layers (`layers.*`, grouped-query attention: the key/value heads split too)."""
    return TensorSplits(styles=encoder_styles(layers, "self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp",
                                            ("gate_proj", "up_proj"), "down_proj"))


def mlp_and_out_channels(transformer: Mapping[str, Any], hidden_size: int) -> tuple[int, int]:
    """(MLP inner width, predicted latent channels) from a transformer config: `ffn_dim` where the config has
    one (else an MLP ratio of 4, as FLUX's and SD3's blocks use), `out_channels` where set (else 16)."""
    return int(transformer.get("ffn_dim") or 4 * hidden_size), int(transformer.get("out_channels") or 16)


def transformer_spec(name: str, family: str, transformer: Mapping[str, Any], *, defaults: Mapping[str, float | int],
                     path: str | None, **facts: Any) -> ModelSpec:
    """A `ModelSpec` whose attention and MLP widths come from the transformer's config (heads, head dim,
    `mlp_and_out_channels`); `facts` are the family's other fields (sizes, patch, layers, text tokens)."""
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    ffn, out_channels = mlp_and_out_channels(transformer, heads * head_dim)
    return ModelSpec(name=name, family=family, num_heads=heads, head_dim=head_dim, ffn_dim=ffn,
                     out_channels=out_channels, defaults=dict(defaults), path=path, **facts)
