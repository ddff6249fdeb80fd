"""`gen run --help` in sections: its options under headings, in the order a user reads them (click's own
formatter, a `click.Command` whose `format_options` writes one section per heading)."""

from __future__ import annotations

import click

Sections = tuple[tuple[str, tuple[str, ...]], ...]
"""(heading, the parameter names under it, in order), in order."""

OTHER = "Other options"
"""The heading of options no section names (none, for a command whose sections are complete)."""

RUN_SECTIONS: Sections = (
    ("Model and sizes", ("model", "width", "height", "size", "num_frames", "num_inference_steps", "guidance_scale",
                         "fps", "dtype")),
    ("Layout", ("nproc", "layout", "profile", "dp", "cfg", "distrifusion", "pp", "ring", "ulysses", "tp", "fsdp",
                "warmup_steps", "patches", "backend", "collective_timeout", "hand_out", "share")),
    ("Memory and speed", ("batch_size", "vae_decode", "vae_memory", "text_encoder_parallel", "quantization",
                          "quantize_text_encoder", "embedding_cache_gib",
                          "cache", "compile", "compile_backend", "compile_cache", "attention")),
    ("Storage and resume", ("out", "storage_option", "storage_timeout", "checkpoint_every", "checkpoint_seconds",
                            "max_attempts", "download")),
    ("Features", ("lora", "lora_scale", "media_allow", "media_max_mib", "media_refuse")),
    ("Output", ("report", "quiet", "help")),  # help: click's own -h/--help
)
"""`gen run`'s sections: what runs and at what size, how it is split, how fast and in how much memory, where it
is kept and how it resumes, the per-row features (LoRA, input media), and what it prints."""


class SectionedCommand(click.Command):
    """A click command whose help lists its options under the headings of `sections`, each in the order given;
    an option no section names goes under `OTHER`."""

    def __init__(self, *args, sections: Sections = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        help_option = self.get_help_option(ctx)
        records = {("help" if param is help_option else param.name): param.get_help_record(ctx)
                   for param in self.get_params(ctx) if isinstance(param, click.Option)}
        placed: set[str | None] = set()
        for heading, names in (*self.sections, (OTHER, tuple(name for name in records if name not in placed))):
            rows = [records[name] for name in names if records.get(name) is not None and name not in placed]
            placed.update(names)
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)
