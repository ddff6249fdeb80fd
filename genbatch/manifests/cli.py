"""`gen validate MANIFEST`: check a manifest without running it; exit 2 / 1 / 0 (file error / rejected rows / clean).

`job_override_options` and `overrides_from_options` are the run-level job options shared with `gen run`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable

import click

from genbatch.jobs.spec import JobOverrides
from genbatch.manifests.report import validate_manifest
from genbatch.jobs import exit_codes


def _cache_mode(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--cache`'s value in canonical form; exit 2 naming the modes that run for any other."""
    from genbatch.jobs.cache import canonical_cache

    try:
        return None if value is None else canonical_cache(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def cache_option(command: Callable) -> Callable:
    """Add `--cache MODE` (the run's step caching; a row's `cache` value overrides it) to a command."""
    return click.option(
        "--cache", callback=_cache_mode, metavar="MODE",
        help="Step caching for rows without a `cache` value: none, fbc:THRESHOLD (First-Block Cache: skip the "
        "blocks after the first while its residual changes by at most THRESHOLD, relative L1), "
        "taylorseer:INTERVAL (one full step in every INTERVAL, the rest predicted) or teacache:THRESHOLD "
        "(skip every block while the rescaled change of the first block's modulated input, accumulated, stays "
        "below THRESHOLD; Wan 2.1 T2V 1.3B and 14B, FLUX.1-dev) [default: none].",
    )(command)


def size_option(what: str) -> Callable:
    """`--size NAME|WxH` (`genbatch.jobs.frame_size`): `what` it sets, as the help's first words. The command
    resolves it against --width and --height with `frame_size`."""
    from genbatch.jobs.frame_size import ACCEPTED

    return click.option("--size", metavar="NAME|WxH", callback=_checked_size,
                        help=f"{what}: {ACCEPTED}; 720p is 1280x720 (not with --width or --height).")


def _checked_size(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--size` as given, once it reads as a size (a usage error naming the accepted forms otherwise)."""
    from genbatch.jobs.frame_size import parse_frame_size

    if value is not None:
        try:
            parse_frame_size(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None
    return value


def job_override_options(command: Callable) -> Callable:
    """Add --model --width --height --size --frames --steps --guidance --fps --cache (run-level job settings)."""
    options = [
        click.option(
            "--model",
            help="Model for rows without a `model` value: a name `gen models` lists (a published model, which "
            "stands for its hub id, or a tiny preset), a hub id (org/name[@revision]) or a diffusers pipeline "
            "directory. Required unless every row names its model.",
        ),
        click.option("--width", type=click.IntRange(min=1), help="Width in pixels for rows without one."),
        click.option("--height", type=click.IntRange(min=1), help="Height in pixels for rows without one."),
        size_option("Width and height for rows without them"),
        click.option(
            "--frames", "num_frames", type=click.IntRange(min=1), help="Frames for video rows without `num_frames`."
        ),
        click.option(
            "--steps",
            "num_inference_steps",
            type=click.IntRange(min=1),
            help="Denoising steps for rows without `num_inference_steps`.",
        ),
        click.option(
            "--guidance",
            "guidance_scale",
            type=click.FloatRange(min=0),
            help="Guidance scale for rows without `guidance_scale`.",
        ),
        click.option("--fps", type=click.IntRange(min=1), help="Frames per second for video rows without `fps`."),
        click.option("--lora", "lora", multiple=True, metavar="URI",
                     help="A LoRA adapter for rows whose `lora` is null (repeatable, applied in order): a hub id "
                     "(org/name[@revision]), or a path or URL of a .safetensors file or its directory."),
        click.option("--lora-scale", "lora_scale", multiple=True, type=float, metavar="S",
                     help="The scale of each --lora, paired by order [default: 1.0]."),
    ]
    for option in reversed(options):
        command = option(command)
    return cache_option(command)


def overrides_from_options(options: dict) -> JobOverrides:
    """The `JobOverrides` of the options `job_override_options` added (other keys are ignored); ValueError naming
    the flags when --lora and --lora-scale do not pair up, or `--size` comes with --width or --height (`gen run`
    and `gen validate` say it as a usage error, exit 2)."""
    from genbatch.jobs.frame_size import frame_size
    from genbatch.jobs.lora import run_loras

    names = ("model", "num_frames", "num_inference_steps", "guidance_scale", "fps", "cache")
    adapters = run_loras(options.get("lora") or (), options.get("lora_scale") or ())
    width, height = frame_size(options.get("size"), options.get("width"), options.get("height"))
    return JobOverrides(**{name: options.get(name) for name in names}, width=width, height=height, lora=adapters)


def media_options(command: Callable) -> Callable:
    """Add --media-allow --media-max-mib --media-refuse: what rows' media URLs may make a rank read."""
    options = [
        click.option("--media-allow", "media_allow", multiple=True, metavar="PREFIX",
                     help="A URL prefix rows' images may be read from (a path, s3://bucket/prefix, "
                          "https://host/path; repeatable) besides the manifest's own directory or bucket prefix and "
                          "the Hugging Face cache. A row outside them is rejected alone."),
        click.option("--media-max-mib", type=click.FloatRange(min=0, min_open=True), default=64, show_default=True,
                     metavar="MIB", help="The most MiB one row's input image may have; a larger one is not read."),
        click.option("--media-refuse", "media_refuse", multiple=True, metavar="CIDR",
                     help="A network never read over http(s) (repeatable), besides link-local (169.254.0.0/16, "
                          "fe80::/10) and metadata addresses (fd00:ec2::254, metadata.google.internal), "
                          "which always are."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def media_policy_from(manifest: str, options: dict):
    """The `MediaPolicy` of the options `media_options` added, for `manifest`."""
    from genbatch.io.media_policy import MediaPolicy, parse_networks

    try:
        refuse = parse_networks(options.get("media_refuse") or ())
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--media-refuse") from None
    return MediaPolicy.for_manifest(manifest, allow=tuple(options.get("media_allow") or ()),
                                    max_mib=options.get("media_max_mib") or 64, refuse=refuse)


def read_or_exit(read):
    """`read()` of a run's records (`gen status`, `gen report`), or its error said and the exit status that fits
    it: storage down past the bound 75 (try again later), refused for good 2; a path with no run, or a bad value,
    2."""
    from genbatch.io import StorageError

    try:
        return read()
    except StorageError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(exit_codes.for_storage_error(error))
    except (FileNotFoundError, ValueError) as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(exit_codes.USAGE)


def storage_options_from(pairs: Iterable[str]) -> dict[str, object]:
    """`--storage-option key=value` strings -> fsspec storage options (parsed by `genbatch.io`)."""
    from genbatch.io.options import parse_storage_options

    try:
        return parse_storage_options(tuple(pairs))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--storage-option") from None


@click.command("validate", short_help="Check a manifest without running it.")
@click.argument("manifest")
@job_override_options
@click.option(
    "--storage-option",
    "storage_option",
    multiple=True,
    metavar="KEY=VALUE",
    help="fsspec option for the manifest's filesystem (repeatable; dotted keys nest).",
)
@click.option("--check-media/--no-check-media", default=True, show_default=True,
              help="Check that every row's image may be read (--media-allow) and exists (one listing per folder, "
                   "not a read per row).")
@media_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def validate_command(
    ctx: click.Context, manifest: str, storage_option: tuple[str, ...], check_media: bool, as_json: bool, **options
) -> None:
    """Check MANIFEST (a Parquet file at any fsspec URL) and report every problem without running anything.

    Exit status: 0 every row is valid, 1 some rows are rejected, 2 the file cannot be used at all or a
    run-level option cannot work for any row (a missing --model, a size the model cannot take).
    """
    try:
        overrides = overrides_from_options(options)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    report = validate_manifest(manifest, overrides=overrides, storage_options=storage_options_from(storage_option),
                               check_media=check_media, media_policy=media_policy_from(manifest, options))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, default=str))
    else:
        for line in report.lines():
            click.echo(line, err=report.exit_code == exit_codes.USAGE)
    ctx.exit(report.exit_code)
