"""HunyuanVideo image-to-video (`diffusers.HunyuanVideoImageToVideoPipeline`): everything genbatch knows about the
family beyond HunyuanVideo's own (`genbatch.models.hunyuan_video`).

The hooks reproduce `HunyuanVideoImageToVideoPipeline.__call__` exactly, with its defaults (`true_cfg_scale=1`:
one forward a step, a row's `negative_prompt` ignored as the pipeline ignores it; the row's `guidance_scale` is
the embedded guidance of a transformer with `guidance_embeds`). The row's image is required (a row without one is
rejected at validation, naming the `image` column), and it enters twice:
- **The prompt encode.** The text encoder is a LLaVA model (`LlavaForConditionalGeneration`: a CLIP vision tower,
  a projector and Llama) that sees the image: its `image_processor` (a CLIP image processor) resizes the row's
  image, as given, so its shortest edge is the processor's size and crops the centre square (336 x 336 for the
  real model), and the template's one `<image>` token becomes the tower's 576 patch tokens. The pipeline keeps
  every second of those image tokens (`image_embed_interleave` 2) before the prompt's 252 (256 padded, less the
  assistant's 4 template tokens): 540 text tokens the transformer attends to jointly, behind their key-padding
  mask, as HunyuanVideo's 256.
- **The latents.** The pipeline's `video_processor` resizes the image to the row's width x height (a plain resize:
  an image of another aspect ratio is stretched, nothing is cropped), the VAE encodes it as one frame (the
  latent's mode, no noise drawn; in the pipeline's own `prepare_latents`, so under the runner's
  `parallel_encoding`: `AutoencoderKLHunyuanVideo` has no patch-parallel rules, so each rank of a job group
  encodes it whole), and the noise starts as 0.999 noise + 0.001 image latents. With `image_condition_type`
  `latent_concat` (HunyuanVideo-I2V's first release, 33 input channels) the image's latents ride as the first
  latent frame of extra channels, zeros after it, with a one-channel first-frame mask: (b, 16 + 16 + 1, f, h, w),
  every step. The stream the transformer splits is HunyuanVideo's (video, then text), so its sequence-parallel
  and tensor splits apply unchanged.
- **The output size.** Width x height are the row's. The pipeline decodes the latents' `num_frames` and drops
  the first 4 frames (`latent_concat`), so the video has the row's `num_frames` less 4 (9 gives 5, 5 gives 1;
  a job of 1 frame would have none and fails, naming the fix).

The second HunyuanVideo-I2V release (`token_replace`, 16 input channels) modulates the first frame's tokens by
their index in the sequence, which a sequence split moves to another rank; genbatch refuses it at spec reading
rather than run it wrong under `--ulysses`/`--ring`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import hunyuan_video
from genbatch.models.base import CLIP_TEXT_ENCODER, Blocks, TinyPreset, decoder_tensor_splits
from genbatch.models.shapes import ImageEncode
from genbatch.models.hooks import COND, Conditioning, Trajectory
from genbatch.models.spec import ModelSpec

IMAGE_CONDITION = "latent_concat"
"""The `image_condition_type` genbatch runs."""
DROPPED_FRAMES = 4
"""`latent_concat`: the decoded frames the pipeline drops from the front of the video."""
IMAGE_TOKENS = 576
"""The LLaVA tower's image tokens in the prompt (the pipeline template's `image_emb_len`)."""
INTERLEAVE = 2
"""`latent_concat`: the pipeline keeps every second image token (its `image_embed_interleave`)."""
TEXT_TOKENS = IMAGE_TOKENS // INTERLEAVE + hunyuan_video.MAX_SEQUENCE_LENGTH - 4
"""The text tokens the transformer attends to: the kept image tokens, then the prompt's padded 256 less the
assistant's 4 template tokens the pipeline crops."""

CALL_DEFAULTS = {**hunyuan_video.CALL_DEFAULTS, "guidance_scale": 1.0}
"""HunyuanVideoImageToVideoPipeline.__call__'s defaults (fps: the pipeline's example export)."""
TINY_TRANSFORMER = dict(hunyuan_video.TINY_TRANSFORMER, in_channels=2 * 4 + 1, out_channels=4,
                        image_condition_type=IMAGE_CONDITION)
"""HunyuanVideo's tiny transformer taking the noise (4), the image's latents (4) and the first-frame mask (1)."""
TINY_DEFAULTS = {**hunyuan_video.TINY_DEFAULTS, "num_frames": 9}
TINY_VISION = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, image_size=48,
                   patch_size=2, projection_dim=32)
"""The tiny LLaVA's CLIP vision tower: 24 x 24 patches, the 576 image tokens the pipeline's template places."""


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    """HunyuanVideo's spec, needing an image, with the image's tokens in the text; a `token_replace` transformer
    is refused (see the module docstring)."""
    condition = transformer.get("image_condition_type")
    if condition != IMAGE_CONDITION:
        raise ValueError(f"model {name}: genbatch runs HunyuanVideo I2V with image_condition_type {IMAGE_CONDITION!r} "
                         f"(HunyuanVideo-I2V-33ch), not {condition!r}: a token_replace transformer modulates the "
                         "first frame's tokens by their place in the sequence, which sequence parallelism splits")
    spec = hunyuan_video.read_spec(name, transformer, vae, defaults or CALL_DEFAULTS, path)
    return replace(spec, family="hunyuan-video-i2v", text_tokens=TEXT_TOKENS, media_inputs=("image",),
                   media_required=("image",))


class HunyuanVideoI2VHooks(hunyuan_video.HunyuanVideoHooks):
    """HunyuanVideo started from an image: the prompt encoded with the image, its latents in extra channels."""

    name = "hunyuan-video-i2v"
    per_row_shared = ("guidance", "image_latents", "mask")

    @staticmethod
    def _image(job: JobSpec):
        if "image" not in job.media:
            raise ValueError(f"model {job.model} starts from an image and job {job.id} has none; fill the row's "
                             "`image` column with a path (relative to the manifest) or URL")
        return job.media["image"].image

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_image2video import DEFAULT_PROMPT_TEMPLATE

        # the LLaVA encoder sees the row's image as given (its processor resizes and crops it)
        embeds, pooled, mask = pipe.encode_prompt(image=self._image(job), prompt=job.prompt, prompt_2=None,
                                                  prompt_template=DEFAULT_PROMPT_TEMPLATE, num_videos_per_prompt=1,
                                                  device=device, max_sequence_length=hunyuan_video.MAX_SEQUENCE_LENGTH,
                                                  image_embed_interleave=INTERLEAVE)
        dtype = pipe.transformer.dtype
        branch = {"encoder_hidden_states": embeds.to(dtype), "encoder_attention_mask": mask.to(dtype),
                  "pooled_projections": pooled.to(dtype)}
        return Conditioning(branches={COND: branch}, guidance_scale=job.guidance_scale)

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        import numpy as np
        import torch
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_image2video import retrieve_timesteps

        if job.num_frames <= DROPPED_FRAMES:
            raise ValueError(f"job {job.id}: {job.model} drops the first {DROPPED_FRAMES} decoded frames, so "
                             f"num_frames {job.num_frames} leaves none; use 5 or more (9 gives 5 frames)")
        # (h, w) image -> (1, 3, H, W) in [-1, 1] at the row's size, stretched as the pipeline's preprocess does
        pixels = pipe.video_processor.preprocess(self._image(job), job.height, job.width).to(device, pipe.vae.dtype)
        channels = (pipe.transformer.config.in_channels - 1) // 2
        # the pipeline's own: the image's latents (its mode) repeated over the latent frames, and the noise
        # (b, c, f, h, w) drawn after the encode, blended 0.999 noise + 0.001 image
        latents, image_latents = pipe.prepare_latents(pixels, 1, channels, job.height, job.width, job.num_frames,
                                                      torch.float32, device, generator, None, IMAGE_CONDITION)
        image_latents[:, :, 1:] = 0  # the image's latents as the first frame, zeros after it
        mask = image_latents.new_ones(image_latents.shape[0], 1, *image_latents.shape[2:])  # (b, 1, f, h, w)
        mask[:, :, 1:] = 0
        steps = job.num_inference_steps
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])
        guidance = None
        if pipe.transformer.config.guidance_embeds:  # the embedded guidance, an input of every forward
            guidance = torch.tensor([job.guidance_scale] * latents.shape[0], dtype=pipe.transformer.dtype,
                                    device=device) * 1000.0
        pipe.scheduler.set_begin_index(0)
        return Trajectory(latents=latents, timesteps=timesteps,
                          shared={"guidance": guidance, "image_latents": image_latents, "mask": mask})

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        import torch

        shared = trajectory.shared
        # (b, c, f, h, w) x 2 + (b, 1, f, h, w) -> (b, 2c + 1, f, h, w): the noise, the image's latents, the mask
        model_input = torch.cat([latents, shared["image_latents"], shared["mask"]], dim=1)
        timestep = t.expand(latents.shape[0]).to(latents.dtype)
        return pipe.transformer(hidden_states=model_input.to(pipe.transformer.dtype), timestep=timestep,
                                guidance=shared["guidance"], attention_kwargs=None, return_dict=False, **branch)[0]

    def postprocess(self, pipe, decoded):
        # (1, c, F, h, w) -> (F - 4, h, w, c) in [0, 1]: the pipeline drops the first 4 decoded frames
        return super().postprocess(pipe, decoded[:, :, DROPPED_FRAMES:])


def tiny_tokenizer():
    """A tokenizer of the pipeline's template (`genbatch.models.prompt_tokenizer`) placed as the pipeline expects
    Llama 3's: a begin-of-text token, `<image>` one special token at position 5 (the template's
    `image_emb_start`), the prompt after 103 tokens (its `crop_start`), each `<|end_header_id|>` one token."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_image2video import DEFAULT_PROMPT_TEMPLATE
    from tokenizers.processors import TemplateProcessing

    from genbatch.models.prompt_tokenizer import template_tokenizer

    template, crop = DEFAULT_PROMPT_TEMPLATE["template"], DEFAULT_PROMPT_TEMPLATE["crop_start"]
    bos = "<|begin_of_text|>"
    # counted as the tokenizer will split the real template: the begin-of-text token the post-processor adds,
    # `system` as two pieces (`syste` and `##m`: Llama 3 has `\n\n` as a token there, this tokenizer drops
    # whitespace), and `<image>` as one token (added below)
    counting = bos + template.replace("system", "syste m", 1).replace("<image>", "<|image|>")
    tokenizer = template_tokenizer(counting, crop, hunyuan_video.MAX_SEQUENCE_LENGTH + crop)
    tokenizer.add_tokens(["<image>"], special_tokens=True)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.convert_tokens_to_ids(bos))])
    ids = tokenizer(template.format("a prompt"))["input_ids"]
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    start = DEFAULT_PROMPT_TEMPLATE["image_emb_start"]
    assert ids.index(image_id) == start and tokenizer.convert_ids_to_tokens(ids[crop - 1]) == "<|end_header_id|>"
    return tokenizer


def build_tiny(meta: frozenset[str] = frozenset()):
    """HunyuanVideo I2V (latent_concat, embedded guidance): HunyuanVideo's tiny transformer taking 9 channels, its
    VAE and CLIP text encoder (`hunyuan_video.build_tiny`), and a LLaVA text encoder (a two-layer CLIP vision tower
    of 576 patch tokens, the three-layer Llama) with its CLIP image processor."""
    import torch
    from diffusers import HunyuanVideoImageToVideoPipeline, HunyuanVideoTransformer3DModel
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    from genbatch.models.tiny import placed

    text_only = hunyuan_video.build_tiny(meta | {"text_encoder", "transformer"})  # its VAE, CLIP and tokenizer
    tokenizer = tiny_tokenizer()
    llama = LlamaConfig(vocab_size=len(tokenizer), **hunyuan_video.TINY_LLAMA)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**TINY_VISION).to_dict(), text_config=llama.to_dict(),
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         pad_token_id=tokenizer.pad_token_id, image_seq_length=IMAGE_TOKENS)
    torch.manual_seed(0)
    with placed("text_encoder", meta):
        llava = LlavaForConditionalGeneration(config).eval()
    torch.manual_seed(2)
    with placed("transformer", meta):
        transformer = HunyuanVideoTransformer3DModel(**TINY_TRANSFORMER).eval()
    size = TINY_VISION["image_size"]
    processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return HunyuanVideoImageToVideoPipeline(text_encoder=llava, tokenizer=tokenizer, transformer=transformer,
                                            vae=text_only.vae, scheduler=text_only.scheduler,
                                            text_encoder_2=text_only.text_encoder_2,
                                            tokenizer_2=text_only.tokenizer_2, image_processor=processor)


FAMILY = replace(
    hunyuan_video.FAMILY,
    name="hunyuan-video-i2v",
    pipelines=("HunyuanVideoImageToVideoPipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=HunyuanVideoI2VHooks(),
    image_encode=ImageEncode(video=False),  # the image alone, as one frame at the output's size
    # the same transformer class as HunyuanVideo's, its stream [video, text] as there: HunyuanVideo's parts
    transformers=hunyuan_video.FAMILY.transformers,
    text_encoders={
        "LlavaForConditionalGeneration": Blocks(
            before=("model.language_model.embed_tokens",),
            # the vision tower runs on the image, then the projector, then the Llama layers
            repeated=("model.vision_tower.encoder.layers", "model.language_model.layers"),
            after=("model.language_model.norm", "lm_head"),
        ),
        "CLIPTextModel": CLIP_TEXT_ENCODER,
    },
    text_encoder_splits={"LlavaForConditionalGeneration": decoder_tensor_splits("model.language_model.layers"),
                        "CLIPTextModel": hunyuan_video.FAMILY.text_encoder_splits["CLIPTextModel"]},
    presets=(TinyPreset(name="tiny-hunyuan-video-i2v", transformer=TINY_TRANSFORMER, vae=hunyuan_video.TINY_VAE,
                        defaults=TINY_DEFAULTS, build=build_tiny),),
    published=(),
    teacache=(),
)
