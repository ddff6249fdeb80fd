"""PipeFusion's bookkeeping, without processes: patch metadata, rotary-table slicing, K/V buffer positions
(also under Ulysses and for joint text + image attention), each patch's part of a 5-D video latent and of a
packed one, and the per-patch schedulers (one step index advance a step, each patch's own multistep history);
an image stream of two grids (the noise's, then an input image's) cut into a share of each grid's rows."""

from __future__ import annotations

import pytest
import torch

from genbatch.models.hooks import TokenGrid
from genbatch.parallel.pipeline.regions import PatchSchedulers, region_masks
from genbatch.parallel.pipeline.state import PipeState


def _state(tokens, patches=2, row_tokens=4, text=(), more=()):
    grids = (TokenGrid(tokens=tokens, row_tokens=row_tokens), *more)
    return PipeState(patches=patches, grids=grids, text_streams=frozenset(text))


def test_patches_hold_whole_token_rows_longer_ones_first():
    state = _state(7 * 4, patches=3, row_tokens=4)
    assert [state.patch_ranges(patch) for patch in range(3)] == [((0, 12),), ((12, 8),), ((20, 8),)]


def test_a_patch_holds_a_share_of_the_rows_of_each_grid_of_the_stream():
    # 3 rows of 4 noise tokens, then an input image's 2 rows of 3: patch 0 holds 2 + 1 rows, patch 1 1 + 1
    state = _state(12, patches=2, row_tokens=4, text=("text",), more=(TokenGrid(tokens=6, row_tokens=3),))
    assert [state.patch_ranges(patch) for patch in range(2)] == [((0, 8), (12, 3)), ((8, 4), (15, 3))]
    state.begin("cond", 1)
    stream = torch.arange(18.0).view(1, 18, 1)
    assert state.cut(stream, 1, "image").view(-1).tolist() == [8, 9, 10, 11, 15, 16, 17]
    assert state.windows == {"image": (18, ((8, 4), (15, 3)))}
    assert state.place(torch.ones(1, 7, 1), 1, "image").view(-1).tolist() == [0] * 8 + [1] * 4 + [0] * 3 + [1] * 3
    # under Ulysses 2 rank 0 gathered the text's first half and the patch's first 4 tokens, rank 1 the rest
    positions, length = state.positions((("text", 2), ("image", 7)), ranks=2, device="cpu")
    assert length == 2 + 18
    assert positions.tolist() == [0, 2 + 8, 2 + 9, 2 + 10, 2 + 11, 1, 2 + 15, 2 + 16, 2 + 17]
    with pytest.raises(RuntimeError, match="must declare the rest"):  # a stream the grids do not make up
        state.cut(torch.zeros(1, 12, 1), 1, "image")


def test_a_patch_forward_cuts_image_streams_and_rotary_tables_and_keeps_text_whole():
    state = _state(8, patches=2, row_tokens=2, text=("encoder_hidden_states",))
    state.begin("cond", 1)
    rope = torch.arange(8.0).view(1, 8, 1, 1).expand(1, 8, 1, 6)  # (1, N, 1, d): one row per token
    assert state.cut(rope, 1, "rope:0")[0, :, 0, 0].tolist() == [4.0, 5.0, 6.0, 7.0]
    text = torch.zeros(1, 5, 3)
    assert state.cut(text, 1, "encoder_hidden_states") is text
    assert state.windows == {"rope:0": (8, ((4, 4),))}
    placed = state.place(torch.ones(1, 4, 2), 1, "rope:0")  # back at its place in a whole-length output
    assert placed[0, :, 0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    state.begin("cond", None)  # a whole forward passes everything through
    assert state.cut(rope, 1, "rope:0") is rope


def test_kv_positions_follow_ulysses_rank_order_into_the_natural_order_buffer():
    state = _state(12, patches=2, row_tokens=3, text=("text",))
    state.begin("cond", 1)
    state.cut(torch.zeros(1, 12, 1), 1, "image")  # patch 1 of 12 image tokens: tokens 6..11
    positions, length = state.positions((("text", 4), ("image", 6)), ranks=2, device="cpu")
    assert length == 4 + 12  # the buffer: all text, then all image tokens
    # rank 0 gathered its text half (0, 1) and its image half (6, 7, 8), then rank 1 its halves
    assert positions.tolist() == [0, 1, 4 + 6, 4 + 7, 4 + 8, 2, 3, 4 + 9, 4 + 10, 4 + 11]


def test_a_patch_of_a_video_latent_is_its_tokens_pixels_over_every_frame_row():
    latents = torch.zeros(1, 2, 2, 4, 4)  # (b, c, f, h, w), patch (1, 2, 2): 2 x 2 x 2 tokens, 2 a row
    first, second = region_masks(latents, (1, 2, 2), [(0, 4), (4, 4)])  # frame 0, frame 1
    assert first.shape == (1, 1, 2, 4, 4) and first[0, 0, 0].all() and not first[0, 0, 1].any()
    halves = region_masks(latents, (1, 2, 2), [(0, 2), (2, 2)])  # one token row each: frame 0's top, bottom
    assert halves[0][0, 0, 0, :2].all() and not halves[0][0, 0, 0, 2:].any() and not halves[0][0, 0, 1].any()
    packed = region_masks(torch.zeros(1, 6, 8), (2, 2), [(0, 3), (3, 3)])  # (b, tokens, c): FLUX
    assert packed[1].view(-1).tolist() == [False] * 3 + [True] * 3


def test_each_patch_steps_once_a_step_and_keeps_its_own_history():
    from diffusers import UniPCMultistepScheduler

    def fresh():
        scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
        scheduler.set_timesteps(4)
        return scheduler

    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 2, 1, 4, 4, generator=generator)
    noises = [torch.randn(latents.shape, generator=generator) for _ in range(3)]
    whole, scheduler = latents.clone(), fresh()
    for t, noise in zip(scheduler.timesteps, noises, strict=False):
        whole = scheduler.step(noise, t, whole, return_dict=False)[0]
    base = fresh()
    masks = region_masks(latents, (1, 2, 2), [(0, 2), (2, 2)])
    patched, parts = latents.clone(), PatchSchedulers(base, masks)
    for t, noise in zip(base.timesteps, noises, strict=False):
        for patch in range(2):  # patch by patch, each with its own copy
            patched = parts.step(patch, noise, t, patched)
    torch.testing.assert_close(patched, whole, rtol=0, atol=1e-6)  # elementwise: the same as the whole step
    assert [copy.step_index for copy in parts.copies] == [3, 3]  # once a step, not once a patch
    parts.merge_into(base, latents)
    assert base.step_index == 3
    torch.testing.assert_close(base.model_outputs[-1], scheduler.model_outputs[-1], rtol=0, atol=1e-6)
