"""LTX-2 text-to-video with sound (`diffusers.LTX2Pipeline`): everything genbatch knows about the family.

`LTX2VideoTransformer3DModel` denoises two streams at once: video tokens (the packed latent of
`AutoencoderKLLTX2Video`, 32x spatial and 8x temporal compression) and audio tokens (the packed mel latent of
`AutoencoderKLLTX2Audio`, 25 a second). Each block runs video self-attention, audio self-attention, text
cross-attention for each stream, then the two streams meet: audio-to-video attention (video queries, audio
keys) and video-to-audio attention (audio queries, video keys), then each stream's MLP.

The text is Gemma 3's hidden states of every layer, stacked and flattened (the prompt padded on the left to
1024 tokens), turned into one video and one audio text stream by the pipeline's `connectors`.

Guidance, as `LTX2Pipeline.__call__` defaults it (its defaults are read from its signature): CFG against the
negative prompt (video scale the row's `guidance_scale`, audio 7), spatio-temporal guidance (STG, a forward with
the self-attention of the `spatio_temporal_guidance_blocks` perturbed), modality guidance (a forward with the
audio-to-video and video-to-audio attention off), each as a delta on the denoised estimate x0 = x - sigma v,
then guidance rescale 0.7. A step runs the pipeline's forwards as it batches them, in two guidance branches:
`cfg` (negative and positive prompts in one forward of batch 2) and `perturbed` (the STG forward, then the
modality one, their predictions stacked the same way), so CFG parallel puts one branch on each cfg rank and
one process equals the pipeline's output bit for bit.

The latent genbatch carries (checkpoints, the scheduler's step) is the video and audio latents side by side,
flattened: (B, Sv * Cv + Sa * Ca). The scheduler's Euler step is element-wise, so stepping the joined latent
is stepping the pipeline's two (its audio scheduler is a copy with the same sigmas).

Sequence parallelism splits the video stream only; the audio stream (126 tokens for 5 s against 6144 video
tokens at 768x512) stays whole on every rank of the sequence group:
- video self-attention (`attn1`) runs over the split video with the family's strategy (Ulysses, Ring, USP);
- audio self-attention (`audio_attn1`), both text cross-attentions (`attn2`, `audio_attn2`) and audio-to-video
  attention (`audio_to_video_attn`: this rank's video queries, the whole audio as keys) need no communication;
- video-to-audio attention (`video_to_audio_attn`: the whole audio as queries, the split video as keys) is the
  one place the streams meet across ranks: each rank attends its audio queries to its own video keys, and the
  partial results merge on their log-sum-exp over the sequence group (`SPLIT_KEYS`), an all-gather of
  (Sa, d_audio) per rank instead of the video's keys and values. Every rank merges the same parts in the same
  order, so the audio stream stays identical on every rank, and equals one process's to fp32 rounding, as
  Ring attention does.
The split is at the transformer's input (the video latent, its positions `video_coords`, and the per-token
timestep an image-to-video row carries), so the rotary tables are computed from each rank's own positions;
the video prediction is gathered after `proj_out`.

Sound: on the group leader after the video decode, the audio latent is denormalised, decoded to a mel
spectrogram by the audio VAE and turned into a waveform by the vocoder, exactly as the pipeline does; the
media encoder writes it as the MP4's AAC track (`genbatch.io.sound`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from genbatch.jobs.spec import JobSpec
from genbatch.models import vae_costs, vae_rules
from genbatch.models.base import (
    COLWISE,
    CROSS,
    HEAD_CHANNELS,
    HEADS,
    NORM_ACROSS_HEADS,
    ROWWISE,
    SELF,
    SPLIT_KEYS,
    AttentionSite,
    Blocks,
    Gather,
    ModelFamily,
    SequenceSplits,
    Split,
    TensorSplits,
    TinyPreset,
    TransformerParts,
)
from genbatch.models.hooks import Conditioning, FamilyHooks, Trajectory
from genbatch.models.ltx2_tiny import TINY_DEFAULTS, TINY_TRANSFORMER, TINY_VAE, build_tiny
from genbatch.models.shapes import Published
from genbatch.models.spec import ModelSpec

CFG = "cfg"
"""The guidance branch of the negative and positive prompts, one forward of batch 2 (the pipeline's)."""
PERTURBED = "perturbed"
"""The guidance branch of the STG forward and the modality-isolated forward, stacked along the batch."""
NEGATIVE, POSITIVE, STG, MODALITY = "negative", "positive", "stg", "modality"
"""The forwards a branch runs (`branch["forwards"]`), in the order its prediction stacks them."""
TEXT_KEYS = ("video_text", "audio_text", "text_mask")
"""The connectors' outputs a forward takes: the video and audio text streams and their mask."""

MAX_SEQUENCE_LENGTH = 1024  # LTX2Pipeline.__call__'s default: the prompt is padded on the left to this length
AUDIO_LATENTS_PER_SECOND = 16000 / 160 / 4  # the published audio VAE: 16 kHz mel, hop 160, 4x temporal compression

CALL_DEFAULTS = {"width": 768, "height": 512, "num_frames": 121, "num_inference_steps": 30, "guidance_scale": 3.0,
                 "fps": 24}
"""LTX2Pipeline.__call__'s defaults (fps: its `frame_rate`, also the export's)."""


# -- the pipeline's own defaults ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Guidance:
    """The guidance of one job as `LTX2Pipeline.__call__` resolves it: the row's `guidance_scale` for video CFG,
    everything else the call's defaults (an audio value of None or 0 takes the video one, as the call does)."""

    video_cfg: float
    audio_cfg: float
    video_stg: float
    audio_stg: float
    video_modality: float
    audio_modality: float
    video_rescale: float
    audio_rescale: float
    stg_blocks: tuple[int, ...]
    """The blocks whose self-attention the STG forward perturbs."""
    use_cross_timestep: bool
    """The cross-modality sigma modulates the audio-video attention (LTX-2.3's behaviour, the call's default)."""

    @property
    def cfg(self) -> bool:
        return self.video_cfg > 1.0 or self.audio_cfg > 1.0

    @property
    def stg(self) -> bool:
        return self.video_stg > 0.0 or self.audio_stg > 0.0

    @property
    def modality(self) -> bool:
        return self.video_modality > 1.0 or self.audio_modality > 1.0


def call_defaults(pipe) -> dict[str, Any]:
    """The keyword defaults of the pipeline class's `__call__` (so a diffusers release that changes them changes
    genbatch with it)."""
    return {name: parameter.default for name, parameter in inspect.signature(type(pipe).__call__).parameters.items()
            if parameter.default is not inspect.Parameter.empty}


def guidance(pipe, job: JobSpec) -> Guidance:
    """The job's guidance, resolved as `LTX2Pipeline.__call__` resolves its arguments."""
    call = call_defaults(pipe)
    video_cfg = float(job.guidance_scale)
    return Guidance(
        video_cfg=video_cfg, audio_cfg=float(call["audio_guidance_scale"] or video_cfg),
        video_stg=float(call["stg_scale"]), audio_stg=float(call["audio_stg_scale"] or call["stg_scale"]),
        video_modality=float(call["modality_scale"]),
        audio_modality=float(call["audio_modality_scale"] or call["modality_scale"]),
        video_rescale=float(call["guidance_rescale"]),
        audio_rescale=float(call["audio_guidance_rescale"] or call["guidance_rescale"]),
        stg_blocks=tuple(call["spatio_temporal_guidance_blocks"] or ()),
        use_cross_timestep=bool(call["use_cross_timestep"]))


# -- sizes ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Grid:
    """The latent sizes of one job: the video latent's (frames, height, width) and channels, the audio latent's
    length, mel bins and channels; every packed shape and offset comes from here."""

    frames: int
    height: int
    width: int
    video_channels: int
    audio_frames: int
    mel_bins: int
    """Latent mel bins (the audio VAE's mel bins over its mel compression)."""
    audio_channels: int

    @property
    def video_tokens(self) -> int:
        return self.frames * self.height * self.width

    @property
    def video_values(self) -> int:
        return self.video_tokens * self.video_channels

    @property
    def audio_values(self) -> int:
        return self.audio_frames * self.mel_bins * self.audio_channels

    def split(self, latents):
        """The joined latent (B, Sv*Cv + Sa*Ca) -> the packed video (B, Sv, Cv) and audio (B, Sa, Ca*M) latents
        (views)."""
        batch = latents.shape[0]
        # (B, Sv*Cv + Sa*Ca*M) -> (B, Sv, Cv), (B, Sa, Ca*M)
        video = latents[:, :self.video_values].view(batch, self.video_tokens, self.video_channels)
        audio = latents[:, self.video_values:].view(batch, self.audio_frames, self.audio_channels * self.mel_bins)
        return video, audio

    @staticmethod
    def join(video, audio):
        """Packed video (B, Sv, Cv) and audio (B, Sa, Ca*M) -> the joined latent (B, Sv*Cv + Sa*Ca*M)."""
        import torch

        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)


def grid(pipe, job: JobSpec) -> Grid:
    """The job's latent sizes, as `LTX2Pipeline.__call__` derives them from the height, width, frames and frame
    rate (the audio lasts as long as the frames at the row's fps)."""
    temporal = pipe.vae_temporal_compression_ratio
    spatial = pipe.vae_spatial_compression_ratio
    duration = job.num_frames / float(job.fps)
    per_second = pipe.audio_sampling_rate / pipe.audio_hop_length / float(pipe.audio_vae_temporal_compression_ratio)
    return Grid(frames=(job.num_frames - 1) // temporal + 1, height=job.height // spatial, width=job.width // spatial,
                video_channels=pipe.transformer.config.in_channels, audio_frames=round(duration * per_second),
                mel_bins=pipe.audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio,
                audio_channels=pipe.audio_vae.config.latent_channels)


def read_spec(name: str, transformer: Mapping[str, Any], vae: Mapping[str, Any],
              defaults: Mapping[str, float | int] | None, path: str | None) -> ModelSpec:
    spatial = int(vae.get("spatial_compression_ratio") or 32)
    temporal = int(vae.get("temporal_compression_ratio") or 8)
    if vae.get("timestep_conditioning"):
        raise ValueError(f"model {name}: its video VAE decodes with timestep conditioning (noise drawn after the "
                         "denoising), which genbatch does not run; LTX-2's VAE has timestep_conditioning=false")
    heads, head_dim = transformer["num_attention_heads"], transformer["attention_head_dim"]
    patch = (transformer.get("patch_size_t", 1), transformer.get("patch_size", 1), transformer.get("patch_size", 1))
    return ModelSpec(
        name=name, family="ltx2", is_video=True, uses_cfg=True,
        size_multiple=32,  # the pipeline refuses sizes that are not multiples of 32
        frame_multiple=temporal, vae_spatial=spatial, patch_size=patch,
        num_layers=transformer["num_layers"], num_heads=heads, head_dim=head_dim,
        text_tokens=MAX_SEQUENCE_LENGTH, joint_text=False, ffn_dim=4 * heads * head_dim,
        out_channels=int(transformer.get("out_channels") or transformer.get("in_channels", 128)),
        defaults=dict(defaults or CALL_DEFAULTS), path=path,
        tp_all_reduces=TENSOR_SPLITS.all_reduces_per_layer({"transformer_blocks": transformer["num_layers"]}),
        # every block attends over the video's tokens and the audio's: one a latent audio frame, at the default
        # frame rate the duration is counted at
        audio_tokens_per_frame=AUDIO_LATENTS_PER_SECOND / CALL_DEFAULTS["fps"],
    )


# -- the denoise hooks ---------------------------------------------------------------------------------------


def _x0(latents, velocity, sigma):
    """The pipeline's `convert_velocity_to_x0`: x - v * sigma."""
    return latents - velocity * sigma


def _guide_modality(latents, predictions: dict, sigma, scales: tuple[float, float, float, float],
                    flags: tuple[bool, bool, bool]):
    """One modality's guided velocity from its branch velocities, as the pipeline's loop computes it: each
    guidance a delta on the conditional x0, then the rescale, then back to a velocity."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

    cfg_scale, stg_scale, modality_scale, rescale = scales
    cfg_on, stg_on, modality_on = flags
    cond = _x0(latents, predictions["cond"], sigma)
    cfg_delta = stg_delta = modality_delta = 0
    if cfg_on:
        cfg_delta = (cfg_scale - 1) * (cond - _x0(latents, predictions["uncond"], sigma))
    if stg_on:
        stg_delta = stg_scale * (cond - _x0(latents, predictions["stg"], sigma))
    if modality_on:
        modality_delta = (modality_scale - 1) * (cond - _x0(latents, predictions["modality"], sigma))
    guided = cond + cfg_delta + stg_delta + modality_delta
    denoised = rescale_noise_cfg(guided, cond, guidance_rescale=rescale) if rescale > 0 else guided
    return (latents - denoised) / sigma  # the pipeline's `convert_x0_to_velocity`


class LTX2Hooks(FamilyHooks):
    name = "ltx2"
    per_row_shared = ("video_coords", "audio_coords")

    # -- encode

    def encode(self, pipe, job: JobSpec, device) -> Conditioning:
        """Gemma 3's stacked hidden states of the prompt (and the negative prompt under CFG), each encoded as the
        pipeline encodes them, then the connectors over [negative, positive] as one batch, as the pipeline runs
        them."""
        import torch

        rules = guidance(pipe, job)
        embeds, mask, negative, negative_mask = pipe.encode_prompt(
            prompt=job.prompt, negative_prompt=job.negative_prompt, do_classifier_free_guidance=rules.cfg,
            num_videos_per_prompt=1, max_sequence_length=MAX_SEQUENCE_LENGTH, device=device)
        if rules.cfg:
            embeds, mask = torch.cat([negative, embeds], dim=0), torch.cat([negative_mask, mask], dim=0)
        side = getattr(pipe.tokenizer, "padding_side", "left") if getattr(pipe, "tokenizer", None) else "left"
        video, audio, connector_mask = pipe.connectors(embeds, mask, padding_side=side)
        # (2, L, d) [negative, positive] -> each half (1, L, d)
        positive = {"video_text": video[-1:], "audio_text": audio[-1:], "text_mask": connector_mask[-1:]}
        if rules.cfg:
            negative = {"negative_video_text": video[:1], "negative_audio_text": audio[:1],
                        "negative_text_mask": connector_mask[:1]}
            branches = {CFG: {**positive, **negative, "forwards": (NEGATIVE, POSITIVE)}}
        else:
            branches = {CFG: {**positive, "forwards": (POSITIVE,)}}
        perturbed = tuple(name for name, on in ((STG, rules.stg), (MODALITY, rules.modality)) if on)
        if perturbed:
            branches[PERTURBED] = {**positive, "forwards": perturbed}
        return Conditioning(branches=branches, guidance_scale=job.guidance_scale)

    # -- trajectory

    def trajectory(self, pipe, job: JobSpec, generator, device) -> Trajectory:
        """The video noise then the audio noise from the row's generator, the shifted sigmas, and the positions of
        both streams, exactly as the pipeline prepares them."""
        import numpy as np
        import torch
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, retrieve_timesteps
        from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

        call = call_defaults(pipe)
        sizes = grid(pipe, job)
        video, shared = self.video_noise(pipe, job, generator, device, call["noise_scale"])
        audio = pipe.prepare_audio_latents(1, num_channels_latents=sizes.audio_channels,
                                           audio_latent_length=sizes.audio_frames,
                                           num_mel_bins=pipe.audio_vae.config.mel_bins, noise_scale=call["noise_scale"],
                                           dtype=torch.float32, device=device, generator=generator, latents=None)
        steps = job.num_inference_steps
        config = pipe.scheduler.config
        mu = calculate_shift(video.shape[1], config.get("base_image_seq_len", 1024),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.95),
                             config.get("max_shift", 2.05))
        timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, device, None,
                                          sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        pipe.scheduler.set_begin_index(0)
        fps = conditioning_frame_rate(float(job.fps), call["motion_speed"])
        shared.update({
            "grid": sizes, "fps": fps, "guidance": guidance(pipe, job),
            "video_coords": pipe.transformer.rope.prepare_video_coords(1, sizes.frames, sizes.height, sizes.width,
                                                                       device, fps=fps),
            "audio_coords": pipe.transformer.audio_rope.prepare_audio_coords(1, sizes.audio_frames, device),
        })
        return Trajectory(latents=Grid.join(video, audio), timesteps=timesteps, shared=shared)

    def video_noise(self, pipe, job: JobSpec, generator, device, noise_scale: float):
        """The packed video latent the denoising starts from (1, Sv, Cv), drawn first from the row's generator, and
        the trajectory's shared values it adds: text-to-video's is noise alone."""
        import torch

        latents = pipe.prepare_latents(1, pipe.transformer.config.in_channels, job.height, job.width, job.num_frames,
                                       noise_scale, torch.float32, device, generator, None)
        return latents, {}

    def timesteps(self, trajectory: Trajectory, timestep) -> dict:
        """The transformer's timestep arguments for a forward of rows at `timestep` (one value a row): text-to-video
        runs every stream at it (the pipeline's `sigma` is the same value)."""
        return {"timestep": timestep, "sigma": timestep}

    def hold(self, trajectory: Trajectory, video_velocity):
        """The guided video velocity (B, Sv, Cv) the scheduler steps with: text-to-video's moves every token."""
        return video_velocity

    # -- one branch's forwards

    @staticmethod
    def _forward(pipe, trajectory: Trajectory, video, audio, text: dict, timestep: dict, coords, **perturbation):
        """One transformer forward as the pipeline's loop calls it (`timestep`: its timestep arguments) -> the joined
        velocity in fp32."""
        sizes: Grid = trajectory.shared["grid"]
        dtype = text["video_text"].dtype
        out_video, out_audio = pipe.transformer(
            hidden_states=video.to(dtype), audio_hidden_states=audio.to(dtype),
            encoder_hidden_states=text["video_text"], audio_encoder_hidden_states=text["audio_text"],
            encoder_attention_mask=text["text_mask"],
            audio_encoder_attention_mask=text["text_mask"], num_frames=sizes.frames, height=sizes.height,
            width=sizes.width, fps=trajectory.shared["fps"], audio_num_frames=sizes.audio_frames,
            video_coords=coords[0], audio_coords=coords[1],
            use_cross_timestep=trajectory.shared["guidance"].use_cross_timestep, attention_kwargs=None,
            return_dict=False, **timestep, **perturbation)
        return Grid.join(out_video.float(), out_audio.float())

    def predict(self, pipe, trajectory: Trajectory, latents, t, step: int, branch):
        """The branch's forwards (`branch["forwards"]`): `cfg` one forward of [negative, positive] (batch 2B, the
        pipeline's); `perturbed` the STG forward then the modality-isolated one, stacked (2B); a job without CFG
        runs its positive prompt alone."""
        import torch

        sizes: Grid = trajectory.shared["grid"]
        rules: Guidance = trajectory.shared["guidance"]
        video, audio = sizes.split(latents)
        coords = (trajectory.shared["video_coords"], trajectory.shared["audio_coords"])
        batch = latents.shape[0]
        plain = dict(isolate_modalities=False, spatio_temporal_guidance_blocks=None, perturbation_mask=None)
        forwards = branch["forwards"]
        if forwards == (NEGATIVE, POSITIVE):
            text = {key: torch.cat([branch[f"negative_{key}"], branch[key]], dim=0) for key in TEXT_KEYS}
            doubled = tuple(coord.repeat((2,) + (1,) * (coord.ndim - 1)) for coord in coords)
            return self._forward(pipe, trajectory, torch.cat([video] * 2), torch.cat([audio] * 2), text,
                                 self.timesteps(trajectory, t.expand(2 * batch)), doubled, **plain)
        timestep = self.timesteps(trajectory, t.expand(batch))
        perturbations = {POSITIVE: plain, STG: {**plain, "spatio_temporal_guidance_blocks": list(rules.stg_blocks)},
                         MODALITY: {**plain, "isolate_modalities": True}}
        parts = [self._forward(pipe, trajectory, video, audio, branch, timestep, coords, **perturbations[name])
                 for name in forwards]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    def combine(self, predictions, guidance_scale: float, t):
        raise NotImplementedError("LTX-2 guides the denoised estimate: its step runs `guide`, which takes the latents")

    def guide(self, pipe, trajectory: Trajectory, predictions, guidance_scale: float, latents, step: int):
        """The pipeline's guidance of step `step`: per modality, CFG, STG and modality deltas on the conditional
        x0, the rescale, back to a velocity; the two modalities joined again for the scheduler's step."""
        sizes: Grid = trajectory.shared["grid"]
        rules: Guidance = trajectory.shared["guidance"]
        batch = latents.shape[0]
        named = {}
        if rules.cfg:
            named["uncond"], named["cond"] = predictions[CFG][:batch], predictions[CFG][batch:]
        else:
            named["cond"] = predictions[CFG]
        if PERTURBED in predictions:
            parts = iter(predictions[PERTURBED].split(batch))
            if rules.stg:
                named["stg"] = next(parts)
            if rules.modality:
                named["modality"] = next(parts)
        sigma = pipe.scheduler.sigmas[step]
        video, audio = sizes.split(latents)
        split = {name: sizes.split(value) for name, value in named.items()}
        flags = (rules.cfg, rules.stg, rules.modality)
        guided_video = _guide_modality(video, {name: value[0] for name, value in split.items()}, sigma,
                                       (rules.video_cfg, rules.video_stg, rules.video_modality, rules.video_rescale),
                                       flags)
        guided_audio = _guide_modality(audio, {name: value[1] for name, value in split.items()}, sigma,
                                       (rules.audio_cfg, rules.audio_stg, rules.audio_modality, rules.audio_rescale),
                                       flags)
        return Grid.join(self.hold(trajectory, guided_video), guided_audio)

    def batch_trajectory(self, rows: list[Trajectory]) -> Trajectory:
        if len({row.shared["grid"] for row in rows}) > 1:
            raise ValueError("the rows of one LTX-2 batch must share their sizes, frames and fps")
        return super().batch_trajectory(rows)

    # -- decode

    def vae_input(self, pipe, job: JobSpec, latents):
        """The video part of the final latent, unpacked and denormalised as the pipeline decodes it."""
        sizes = grid(pipe, job)
        video, _ = sizes.split(latents)
        # (B, Sv, Cv) -> (B, Cv, F, H, W)
        video = pipe._unpack_latents(video, sizes.frames, sizes.height, sizes.width,
                                     pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size)
        vae = pipe.vae
        video = video.to(pipe.text_encoder.dtype)  # the pipeline's `latents.to(prompt_embeds.dtype)`
        video = pipe._denormalize_latents(video, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        return video.to(device=next(vae.parameters()).device, dtype=vae.dtype)

    def postprocess(self, pipe, decoded):
        # (1, c, f, h, w) -> (f, h, w, c) in [0, 1]
        return pipe.video_processor.postprocess_video(decoded, output_type="np")[0]

    def wants_sound(self, job: JobSpec) -> bool:
        """Whether the row's output carries its sound: unless its `audio` is false (`genbatch.jobs.inputs.audio`);
        the sound is then neither decoded nor written (the latents still denoise both streams, as the pipeline's
        do)."""
        return job.audio is not False

    def soundtrack(self, pipe, job: JobSpec, latents):
        """The audio part of the final latent -> the waveform (channels, samples) in fp32 and its sample rate, as the
        pipeline makes it: denormalised (packed), unpacked, the audio VAE's mel spectrogram, the vocoder."""
        from genbatch.io.sound import Soundtrack

        sizes = grid(pipe, job)
        _, audio = sizes.split(latents)
        audio_vae = pipe.audio_vae
        audio = pipe._denormalize_audio_latents(audio, audio_vae.latents_mean, audio_vae.latents_std)
        # (B, Sa, Ca*M) -> (B, Ca, Sa, M)
        audio = pipe._unpack_audio_latents(audio, sizes.audio_frames, num_mel_bins=sizes.mel_bins)
        audio = audio.to(device=next(audio_vae.parameters()).device, dtype=audio_vae.dtype)
        mel = audio_vae.decode(audio, return_dict=False)[0]
        waveform = pipe.vocoder(mel)
        return Soundtrack(samples=waveform[0].float().cpu().numpy(),
                          sample_rate=int(pipe.vocoder.config.output_sampling_rate))


# -- the parts -----------------------------------------------------------------------------------------------

_ATTENTION = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")

TENSOR_SPLITS = TensorSplits(
    styles={
        # every attention of both streams: q, k, v split by heads, the output projection row-wise, the QK norms
        # (over all heads) all-reduced; the rotary tables span all heads' channels, so each rank keeps its heads'
        **{f"transformer_blocks.*.{attn}.{proj}": COLWISE for attn in _ATTENTION for proj in ("to_q", "to_k", "to_v")},
        **{f"transformer_blocks.*.{attn}.to_out.0": ROWWISE for attn in _ATTENTION},
        **{f"transformer_blocks.*.{attn}.{norm}": NORM_ACROSS_HEADS for attn in _ATTENTION
           for norm in ("norm_q", "norm_k")},
        **{f"transformer_blocks.*.{attn}": HEADS for attn in _ATTENTION},
        **{f"transformer_blocks.*.{ff}.net.0.proj": COLWISE for ff in ("ff", "audio_ff")},
        **{f"transformer_blocks.*.{ff}.net.2": ROWWISE for ff in ("ff", "audio_ff")},
        **{rope: HEAD_CHANNELS for rope in ("rope", "audio_rope", "cross_attn_rope", "cross_attn_audio_rope")},
    },
    # the video stream's: self-attention, text cross-attention, audio-to-video attention and MLP outputs (the
    # audio stream's four are of its 25 tokens a second, about 2% of the video's at 768x512, and not counted)
    all_reduces={"transformer_blocks": 4},
)
"""LTX-2's tensor splits (diffusers has none): both streams' heads and MLPs; the timestep modulations, computed
once a forward, stay whole."""

SEQUENCE = SequenceSplits(
    points={
        # the video stream, its positions and (image-to-video) its per-token timestep split at the input; the
        # rotary tables are then computed from each rank's own positions
        "": {"hidden_states": Split(dim=1, expected_dims=3), "video_coords": Split(dim=2, expected_dims=4),
             "timestep": Split(dim=1, expected_dims=2)},
        "proj_out": Gather(dim=1, expected_dims=3),
    },
)
"""Video split, audio whole (see the module docstring)."""

_VIDEO = ("hidden_states",)
ATTENTION = (
    AttentionSite(pattern="transformer_blocks.*.attn1", kind=SELF, streams=_VIDEO),
    # the audio stream is whole on every rank: its self-attention needs no communication
    AttentionSite(pattern="transformer_blocks.*.audio_attn1", kind=CROSS, streams=()),
    AttentionSite(pattern="transformer_blocks.*.attn2", kind=CROSS, streams=(), masked=True),
    AttentionSite(pattern="transformer_blocks.*.audio_attn2", kind=CROSS, streams=(), masked=True),
    # video queries (split) to the whole audio
    AttentionSite(pattern="transformer_blocks.*.audio_to_video_attn", kind=CROSS, streams=()),
    # the whole audio's queries to the split video: merged over the group on the log-sum-exp
    AttentionSite(pattern="transformer_blocks.*.video_to_audio_attn", kind=SPLIT_KEYS, streams=_VIDEO),
)


# -- the planner's published shape ---------------------------------------------------------------------------

PUBLISHED_CONFIG = {
    "transformer": dict(in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32,
                        attention_head_dim=128, cross_attention_dim=4096, vae_scale_factors=(8, 32, 32),
                        audio_in_channels=128, audio_out_channels=128, audio_num_attention_heads=32,
                        audio_attention_head_dim=64, audio_cross_attention_dim=2048, audio_scale_factor=4,
                        audio_sampling_rate=16000, audio_hop_length=160, num_layers=48, caption_channels=3840),
    "vae": dict(latent_channels=128, block_out_channels=(256, 512, 1024, 2048),
                decoder_block_out_channels=(256, 512, 1024), layers_per_block=(4, 6, 6, 2, 2),
                decoder_layers_per_block=(5, 5, 5, 5), patch_size=4, timestep_conditioning=False,
                spatial_compression_ratio=32, temporal_compression_ratio=8),
    "vocoder": dict(in_channels=128, hidden_channels=1024, out_channels=2, upsample_factors=[6, 5, 2, 2, 2],
                    output_sampling_rate=24000),
    "text_encoder": "google/gemma-3-12b (Gemma3ForConditionalGeneration), hidden 3840, 48 layers",
}
"""Lightricks/LTX-2 (LTX-2.0) as diffusers' conversion script writes it (huggingface/diffusers
scripts/convert_ltx2_to_diffusers.py, `get_ltx2_transformer_config("2.0")`, `get_ltx2_video_vae_config("2.0")`,
`get_ltx2_vocoder_config("2.0")`): the model card's 19B (14B video stream, 5B audio stream)."""


FAMILY = ModelFamily(
    name="ltx2",
    pipelines=("LTX2Pipeline",),
    call_defaults=CALL_DEFAULTS,
    read_spec=read_spec,
    hooks=LTX2Hooks(),
    transformers={
        "LTX2VideoTransformer3DModel": TransformerParts(
            blocks=Blocks(before=("proj_in", "audio_proj_in", "caption_projection", "audio_caption_projection",
                                  "time_embed", "audio_time_embed", "av_cross_attn_video_scale_shift",
                                  "av_cross_attn_audio_scale_shift", "av_cross_attn_video_a2v_gate",
                                  "av_cross_attn_audio_v2a_gate", "rope", "audio_rope", "cross_attn_rope",
                                  "cross_attn_audio_rope"),
                          repeated=("transformer_blocks",),
                          after=("norm_out", "proj_out", "audio_norm_out", "audio_proj_out")),
            attention=ATTENTION,
            sequence=SEQUENCE,
            tensor_splits=TENSOR_SPLITS,
            compile_units=("transformer_blocks.*",),  # diffusers' _repeated_blocks: LTX2VideoTransformerBlock
        ),
    },
    text_encoders={
        "Gemma3ForConditionalGeneration": Blocks(
            before=("model.language_model.embed_tokens",),
            repeated=("model.vision_tower.vision_model.encoder.layers", "model.language_model.layers"),
            after=("model.language_model.norm", "lm_head")),
    },
    vae_classes=("diffusers:AutoencoderKLLTX2Video",),
    vae_rules=vae_rules.AUTOENCODER_KL_LTX2_VIDEO,
    presets=(TinyPreset(name="tiny-ltx2", transformer=TINY_TRANSFORMER, vae=TINY_VAE, defaults=TINY_DEFAULTS,
                        build=build_tiny),),
    vae_costs=vae_costs.LTX2_VIDEO_VAE,
    published=(
        Published(name="ltx-2", hub_id="Lightricks/LTX-2", transformer=PUBLISHED_CONFIG["transformer"],
                  vae=PUBLISHED_CONFIG["vae"], parameters=19.0e9,  # model card: 14B video + 5B audio
                  text_encoder_parameters=12.2e9,  # Gemma 3 12B (the connectors' 2 x 2 blocks are small beside it)
                  vae_parameters=0.55e9),  # AutoencoderKLLTX2Video (its decoder 5 resnets a stage at 256-1024)
    ),
)

