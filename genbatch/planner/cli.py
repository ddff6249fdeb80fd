"""`gen plan`: rank parallel layouts for a model on some GPUs (argument handling only)."""

from __future__ import annotations

import json
import os

import click

from genbatch.jobs.exit_codes import USAGE
from genbatch.jobs.frame_size import frame_size
from genbatch.jobs.quantization import parse_quantization
from genbatch.manifests.cli import size_option
from genbatch.models.spec import UnknownModelError
from genbatch.parallel.flags import layout_options, quantization_options
from genbatch.planner.calibrate import calibrate_runs, format_fit
from genbatch.planner.constraints import LayoutConstraints
from genbatch.planner.hardware import GPUS, NETWORKS, NODE_LINKS
from genbatch.planner.memory import DECODE_CHOICES
from genbatch.planner.profile import load_profile, save_profile
from genbatch.planner.rank import OBJECTIVES, plan
from genbatch.planner.report import format_table, plan_to_dict


def _size(text: str | None) -> tuple[int, int] | None:
    """`--input-size 1184x880` as (width, height); ValueError naming the form otherwise."""
    if text is None:
        return None
    width, _, height = text.lower().partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise ValueError(f"--input-size {text!r} must be WIDTHxHEIGHT in pixels, e.g. 1184x880")
    return int(width), int(height)


@click.command("plan", short_help="Rank parallel layouts by speed; print the best one's command.")
@click.option("--model", "-m", default=None,
              help="Model: a name `gen models` lists (a published model, a preset or a model gen plan alone "
              "prices), a hub id (priced as the published model it is) or a diffusers pipeline directory.")
@click.option("--gpus", "-g", type=int, default=None, help="GPUs in total.")
@click.option("--nodes", type=int, default=1, show_default=True, help="Machines the GPUs are spread over.")
@click.option("--interconnect", type=click.Choice(NODE_LINKS + NETWORKS), default=None,
              help="One node: the GPU link (default: the GPU's usual one). Several nodes: the network between "
              "them (default infiniband).")
@click.option("--intra-node", type=click.Choice(NODE_LINKS), default=None,
              help="With several nodes: the GPU link inside each (default: the GPU's usual one).")
@click.option("--network-gbps", type=float, default=None, help="Network rate between nodes, Gbit/s per GPU.")
@click.option("--gpu", type=click.Choice(sorted(GPUS)), default=None,
              help="GPU model (default: the profile's, else h100); with --calibrate, the GPUs the runs used.")
@click.option("--gpu-mem", type=float, default=None, help="GiB per GPU the run may use (default: the GPU's).")
@click.option("--width", type=int, default=None, help="Output width (default: the model's).")
@click.option("--height", type=int, default=None, help="Output height (default: the model's).")
@size_option("Output width and height")
@click.option("--frames", type=int, default=None, help="Video frames (default: the model's).")
@click.option("--steps", type=int, default=None, help="Denoising steps (default: the model's).")
@click.option("--guidance", type=float, default=None,
              help="The jobs' guidance scale (default: the model's); 1 or less runs one forward a step (a distilled "
                   "LoRA's recipe), so no layout splits CFG.")
@click.option("--image/--no-image", "image", default=None,
              help="Whether the jobs start from an image, whose VAE encode is priced (default: as the model does: "
              "Wan I2V encodes its conditioning video, an edit model its input image; Kontext and Wan 2.2 TI2V "
              "run without one too).")
@click.option("--input-size", default=None, metavar="WxH",
              help="An edit model's input image as its pipeline resizes it (default: its area, a megapixel, at the "
              "output's aspect ratio).")
@click.option("--batch-size", type=int, default=1, show_default=True,
              help="Rows denoised together in one forward (as gen run --batch-size): GEMMs get N times the rows and "
              "activations N times the memory; the weights, the VAE encode and decode (row by row) do not grow.")
@click.option("--offload-text-encoder", is_flag=True,
              help="Text encoders leave the GPU after encoding (less memory, a reload per job).")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="throughput", show_default=True,
              help="throughput: most jobs per hour (data parallel first); latency: fewest seconds per job.")
@click.option("--max-latency", type=float, default=None, help="Reject layouts slower than this, seconds per job.")
@click.option("--vae-decode", "decode", type=click.Choice(DECODE_CHOICES), default="auto", show_default=True,
              help="How each job's VAE decodes (as gen run): auto takes an exact mode that fits (parallel over the "
              "job group, else full on its leader) and tiled only when none does.")
@quantization_options
@layout_options(constraints=True)
@click.option("--top", type=int, default=10, show_default=True, help="Layouts the table shows.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole plan as JSON.")
@click.option("--calibrate", "calibrate", multiple=True, type=click.Path(file_okay=False),
              help="Fit a profile to the step timings of these `gen run` / `gen bench` OUT folders (repeatable), "
              "save it (--profile-out), print the fit, and plan with it when --model and --gpus are given.")
@click.option("--profile-out", default=None,
              help="With --calibrate: a profile NAME (under $XDG_CONFIG_HOME/genbatch/profiles) or a PATH.json "
              "(default: DEVICE-MODEL of the runs).")
@click.option("--profile", "profile_name", default=None,
              help="Price layouts with this calibration profile (NAME or PATH) where it measured, published "
              "figures elsewhere.")
def plan_command(model, gpus, nodes, interconnect, intra_node, network_gbps, gpu, gpu_mem, width, height, size, frames,
                 steps, guidance, image, input_size, batch_size, offload_text_encoder, objective, max_latency, decode,
                 quantization, quantize_text_encoder, top, as_json, calibrate, profile_out, profile_name,
                 **layout) -> None:
    """Rank every legal parallel layout (dp, cfg, distrifusion, pp, ring, ulysses, tp, fsdp) by
    estimated seconds per job and jobs per hour, showing compute, communication and memory per rank.

    The layout flags of `gen run` (--dp --cfg --distrifusion --pp --ring --ulysses --tp --fsdp/--no-fsdp) are
    constraints here: `--ulysses 4` ranks only layouts with ulysses 4.

    Calibration: `gen plan --calibrate OUT... [--profile-out NAME]` fits the cost model's free parameters to
    measured steps and saves them as a profile; `gen plan --profile NAME ...` plans with it."""
    try:
        profile = None
        if calibrate:
            if profile_name:
                raise ValueError("--calibrate makes a profile and plans with it; drop --profile")
            name = os.path.basename(profile_out).removesuffix(".json") if profile_out else None
            fitted = calibrate_runs(list(calibrate), name=name, gpu=gpu or "h100", interconnect=interconnect)
            path = save_profile(fitted.profile, profile_out or fitted.profile.name)
            click.echo(format_fit(fitted, path), err=as_json)
            profile = fitted.profile
            if model is None and gpus is None:
                return
        elif profile_name:
            profile = load_profile(profile_name)
        if model is None or gpus is None:
            raise ValueError("give --model and --gpus (or --calibrate OUT... alone to make a profile)")
        width, height = frame_size(size, width, height)
        if gpu is None:
            gpu = profile.device if profile is not None and profile.device in GPUS else "h100"
        result = plan(model, gpus, nodes=nodes, interconnect=interconnect, intra_node=intra_node,
                      network_gbps=network_gbps, gpu=gpu, gpu_mem=gpu_mem, width=width, height=height, frames=frames,
                      steps=steps, guidance=guidance, offload_text_encoder=offload_text_encoder, objective=objective,
                      max_latency=max_latency, constraints=LayoutConstraints(**layout), profile=profile,
                      decode=decode, image=image, input_size=_size(input_size), batch_size=batch_size,
                      quantization=parse_quantization(quantization, quantize_text_encoder))
    except (UnknownModelError, ValueError) as error:
        click.echo(f"error: {error}", err=True)
        raise SystemExit(USAGE) from None
    if as_json:
        click.echo(json.dumps(plan_to_dict(result, model=model), indent=1))
    else:
        click.echo(format_table(result, top=top, model=model))
