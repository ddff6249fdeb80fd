"""The layout flags, one definition for `gen run` (the layout to run) and `gen plan` (constraints on the ranking).

    @layout_options(constraints=False)     # gen run:  --dp (the rest) --cfg 1 --pp 1 --ring 1 --ulysses 1 --tp 1 --no-fsdp
    @layout_options(constraints=True)      # gen plan: every flag unset, so every layout is ranked

One flag per row of the axis table (`parallel/axes.py`), in its order, with the row's help, spellings and
largest degree, and `--fsdp/--no-fsdp`. `gen run` defaults each degree to 1 (`--dp` to the rest of the world);
`gen plan` leaves them unset, and a flag given keeps only the layouts with that degree (`--ulysses 4`),
`--fsdp` only those that shard weights, `--no-fsdp` only those that do not.
"""

from __future__ import annotations

import click

from genbatch.parallel.axes import AXES, AXIS

_FSDP_HELP = {
    False: "Shard transformer and text-encoder weights over each job group (FSDP2).",
    True: "--fsdp ranks only layouts that shard weights over the job group (FSDP2), --no-fsdp only those that do not.",
}


def _degree_type(axis: str) -> click.ParamType:
    return click.IntRange(1, AXIS[axis].max_degree)


def _names(axis: str) -> tuple[str, ...]:
    return (f"--{axis}", *AXIS[axis].aliases, axis)


def _degree_option(axis: str, constraints: bool):
    if constraints:
        return click.option(*_names(axis), type=_degree_type(axis), default=None,
                            help=f"Rank only layouts with this {axis} degree ({AXIS[axis].what}).")
    if axis == "dp":
        return click.option("--dp", type=_degree_type(axis), help=AXIS[axis].help)
    return click.option(*_names(axis), type=_degree_type(axis), default=1, show_default=True, help=AXIS[axis].help)


def layout_options(*, constraints: bool):
    """A decorator adding one flag per axis (`--dp --cfg --distrifusion --pp --ring --ulysses --tp`) and
    `--fsdp/--no-fsdp` to a click command; their values reach it as keyword arguments of the same names.
    `constraints`: unset by default (`gen plan`)."""
    options = [_degree_option(axis, constraints) for axis in AXES]
    options.append(click.option("--fsdp/--no-fsdp", default=None if constraints else False,
                                show_default=not constraints, help=_FSDP_HELP[constraints]))

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
"""The torch.compile backends `--compile-backend` takes: inductor (generates fused code: the fast one), and
two that skip code generation (aot_eager traces through AOTAutograd, eager only runs dynamo), to check
tracing and graph breaks."""


ATTENTION_KERNELS = ("auto", "flash-attn", "cudnn", "flash", "efficient", "math", "cpu-flash")
"""`--attention`'s values (`genbatch.parallel.attention.local.KERNELS` maps them to the backends)."""


def kernel_options(command):
    """A decorator adding `--compile/--no-compile`, `--compile-backend`, `--compile-cache` and `--attention` to a
    click command (gen run, gen bench); their values reach it as `compile`, `compile_backend`, `compile_cache`
    and `attention`. They are not
    layout flags: `--layout auto` keeps them."""
    command = click.option("--compile-cache", metavar="URL",
                           help="Keep compiled artifacts here (any fsspec URL) for later runs and requeues "
                                "[default: OUT/compile-cache].")(command)
    command = click.option("--attention", type=click.Choice(ATTENTION_KERNELS), default="auto", show_default=True,
                           help="The attention kernel on each rank, with or without sequence parallel: auto takes "
                                "the fastest legal one for the device, dtype and head size; one that cannot run "
                                "exits 2 at start-up naming one that can.")(command)
    command = click.option("--compile-backend", type=click.Choice(COMPILE_BACKENDS), default="inductor",
                           show_default=True, help="The torch.compile backend --compile uses.")(command)
    return click.option("--compile/--no-compile", default=False, show_default=True,
                        help="torch.compile each repeated transformer block's forward (after sequence parallel, "
                             "before FSDP); mixed sizes compile at most twice per block class.")(command)


def kernel_args(compile: bool, compile_backend: str = "inductor", attention: str = "auto",
                compile_cache: str | None = None) -> list[str]:
    """The `gen run` arguments that give these settings (what gen bench passes on)."""
    args = ["--attention", attention] if attention != "auto" else []
    args += ["--compile-cache", compile_cache] if compile_cache else []
    if not compile:
        return args
    return args + ["--compile"] + ([] if compile_backend == "inductor" else ["--compile-backend", compile_backend])


def quantization_options(command):
    """A decorator adding `--quantization` and `--quantize-text-encoder` to a click command (gen run, gen plan,
    gen bench); their values reach it as `quantization` and `quantize_text_encoder`
    (`genbatch.jobs.quantization.parse_quantization` reads them)."""
    from genbatch.jobs.quantization import QUANTIZATIONS

    command = click.option("--quantize-text-encoder/--no-quantize-text-encoder", "quantize_text_encoder",
                           default=False, show_default=True,
                           help="With --quantization: quantize the text encoders' Linear layers too (each rank "
                                "then holds them whole, at that width: --text-encoder-parallel auto replicates "
                                "them).")(command)
    return click.option("--quantization", type=click.Choice(QUANTIZATIONS), default="none", show_default=True,
                        help="Quantize the transformer's Linear layers at load (torchao): fp8 (e4m3 weights, one "
                             "scale a row; on GPUs with FP8 GEMMs, compute capability 8.9 or more, each activation "
                             "is scaled to FP8 too and the matmuls run in FP8; elsewhere weight-only) or int8 "
                             "(weight-only). The weights take half of bf16's memory; norms, embeddings and the VAE "
                             "stay in the run's dtype; LoRA deltas are merged into the dequantized weights and "
                             "quantized again. Not with --tp or --fsdp (torchao's tensors do not shard).")(command)
