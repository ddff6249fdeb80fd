#!/usr/bin/env bash
# genbatch on GPUs (steps 1-6 aimed at about 6 minutes on one H200, cold compiles and the FLUX build included; steps 7 and 8 add
# about 5 more on one GPU, and runs every multi-rank layout the GPUs present allow):
#   1. `gen bench --suite gpu --layouts single`: the GPU suite (Wan 2.1 1.3B architecture, random weights, bf16,
#      4 clips of 832x480, 33 frames, 10 steps) on one GPU, with its report (Markdown, Parquet, plots);
#   2. genbatch against the plain diffusers pipeline (WanPipeline.__call__) on the same work, each in a fresh
#      process, measured the same way: seconds per step and peak memory, ratios genbatch / diffusers printed
#      (issue 3's target: at most 1.00x);
#   3. the same pairing compiled: genbatch `--compile` against diffusers `compile_repeated_blocks(fullgraph=True)`
#      (inductor; cold compiles included in the wall time, the median step excludes them; target: genbatch's step
#      within 1.02x of diffusers', and compiled at least 1.3x faster than step 2's eager);
#   4. the attention kernels, eager: cuDNN attention on both sides (`--attention cudnn`), and flash-attn only when
#      the machine already has it;
#   5. the FLUX.1-dev architecture (12B, random weights built on the GPU, bf16) at 1024x1024, 2 images, 10 steps:
#      genbatch against FluxPipeline.__call__ eager, then compiled (`--compile` against compile_repeated_blocks);
#   6. batched rows (`--batch-size`) on the same FLUX.1-dev model: batch 1, 4 and 16 at 512x512 and batch 1 and 2
#      at 1024x1024, 4 steps, jobs per hour and the ratios to batch 1 (bench/batching.py; SGLang measured
#      Qwen-Image on an H200 at 3.21x for batch 16 at 512x512 and 1.02x for batch 2 at 1024x1024);
#   7. genbatch's parallel layouts against diffusers' own (`enable_parallelism`: ContextParallelConfig /
#      TensorParallelConfig), both launched by torchrun, on the Wan 2.1 1.3B architecture at 480p and FLUX.1-dev at
#      1024x1024, cuDNN attention on both sides, A B B A (bench/versus_parallel.py): one process, ulysses 2 and 4,
#      ring 2, ulysses 2 x ring 2, tp 2, those that fit the GPUs present, one rank a GPU. On one GPU only the
#      one-process pairing runs and every multi-rank layout is printed as not run, with why: ranks sharing one GPU
#      would time-slice its SMs (and NCCL refuses two ranks on one device), which measures neither library's
#      parallel step. Target: every layout both run at or below 1.00x diffusers' step time.
#   8. quantized weights (`--quantization`, bench/quantization.py): Wan 2.1 1.3B (832x480, 33 frames) and FLUX.1-dev
#      (1024x1024), one row each, 4 steps: bf16, fp8 (FP8 GEMMs with dynamic activation scaling on this GPU) and
#      int8 eager, fp8 compiled (and bf16 compiled on Wan), each in a fresh process: s/step, peak memory and
#      PSNR / SSIM against bf16 eager (aimed at about 2 minutes; alone: GENBATCH_BENCH_STEPS=8).
# Every step prints its seconds, so a run that overran says which step to trim.
# Results go to bench/results/gpu/<UTC time>/ (commit them).
#
#   bash bench/gpu.sh                        # a machine with one NVIDIA GPU and CUDA torch installed
#   bash bench/gpu.sh --device cpu --tiny    # the same steps at tiny size on a CPU (the tests run this)
#
# Environment: GENBATCH_BENCH_STEPS (the steps to run, default "1 2 3 4 5 6 7 8"); PYTHON (default .venv/bin/python when present, else python3); GENBATCH_BENCH_RESULTS (default
# bench/results/gpu); GENBATCH_BENCH_BASELINE (an earlier suite report to compare with, optional);
# GENBATCH_BENCH_ARCHIVE (a .tar.gz path: the results folder is packed there at exit, to copy back from a
# remote machine, also when a step failed).
# genbatch runs from this checkout. When the interpreter lacks diffusers, imageio-ffmpeg or torchao: on a machine with
# no package registry, make the wheels here first (bash bench/gpu-wheels.sh -> .whl/), carry .whl, and this
# script installs them into GENBATCH_SITE (default /tmp/genbatch-site) without touching anything else;
# without .whl/ it runs `pip install -e .` (pip keeps the installed CUDA torch, which satisfies the requirement).
set -euo pipefail
cd "$(dirname "$0")/.."

device=cuda
suite=gpu
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=$2; shift 2 ;;
        --tiny) suite=tiny; shift ;;
        -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
        *) echo "bench/gpu.sh: unknown argument $1 (use --device cuda|cpu, --tiny)" >&2; exit 2 ;;
    esac
done

site=${GENBATCH_SITE:-/tmp/genbatch-site}
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
# genbatch from this checkout, installed or not (the benchmark's own processes inherit the path)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import diffusers, imageio_ffmpeg, torchao, genbatch" >/dev/null 2>&1; then
    if compgen -G ".whl/*.whl" >/dev/null; then  # carried from bench/gpu-wheels.sh: no registry needed
        echo "bench/gpu.sh: installing the wheels in .whl/ into $site" >&2
        "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
        export PYTHONPATH="$site:$PYTHONPATH"
    else
        echo "bench/gpu.sh: installing genbatch and its dependencies from this checkout into $py" >&2
        "$py" -m pip install -q -e .
    fi
fi
if [ "$device" = cpu ]; then
    export CUDA_VISIBLE_DEVICES=""   # gen run takes a GPU whenever one is visible
elif ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench/gpu.sh: torch sees no CUDA GPU; install a CUDA build of torch, or pass --device cpu --tiny" >&2
    exit 2
fi

results=${GENBATCH_BENCH_RESULTS:-bench/results/gpu}/$(date -u +%Y%m%dT%H%M%SZ)$([ "$suite" = tiny ] && echo -tiny || true)
mkdir -p "$results"
started=$SECONDS
archive() {  # whatever was measured, even when a step failed
    if [ -n "${GENBATCH_BENCH_ARCHIVE:-}" ]; then
        rm -rf "$results/suite/runs" "$results"/versus*/*-[0-9]*/run/outputs "$results"/quantization/*/*/run/outputs
        tar -czf "$GENBATCH_BENCH_ARCHIVE" -C "$(dirname "$results")" "$(basename "$results")"
        echo "bench/gpu.sh: results archived in $GENBATCH_BENCH_ARCHIVE" >&2
    fi
}
trap archive EXIT

baseline=()
if [ -n "${GENBATCH_BENCH_BASELINE:-}" ]; then baseline=(--baseline "$GENBATCH_BENCH_BASELINE"); fi
steps=" ${GENBATCH_BENCH_STEPS:-1 2 3 4 5 6 7 8} "
want() { [[ "$steps" == *" $1 "* ]]; }
step_started=$SECONDS
took() { echo "bench/gpu.sh: $1 took $((SECONDS - step_started)) s" >&2; step_started=$SECONDS; }
status=0
if want 1; then
echo "== 1/8 gen bench --suite $suite on one device -> $results/suite" >&2
"$py" -m genbatch bench --suite "$suite" --layouts single --out "$results/suite" "${baseline[@]}" || status=$?
took "step 1"
fi

if want 2; then
echo "== 2/8 genbatch vs diffusers on $device -> $results/versus" >&2
"$py" -m genbatch.benchmark.versus --suite "$suite" --device "$device" --out "$results/versus" || status=$?
took "step 2"
fi

# at tiny size (the tests) aot_eager stands in for inductor and math for the CUDA kernels: the same steps, cheap
compile_backend=$([ "$suite" = tiny ] && echo aot_eager || echo inductor)
if want 3; then
echo "== 3/8 compiled ($compile_backend): genbatch --compile vs diffusers compile_repeated_blocks -> $results/versus-compiled" >&2
"$py" -m genbatch.benchmark.versus --suite "$suite" --device "$device" --out "$results/versus-compiled" \
    --compile-backend "$compile_backend" || status=$?
took "step 3"
fi

if want 4; then
kernels=(cudnn)
if [ "$device" = cpu ]; then kernels=(math); fi
if [ "$device" != cpu ] && "$py" -c "import flash_attn" >/dev/null 2>&1; then kernels+=(flash-attn); fi
for kernel in "${kernels[@]}"; do
    echo "== 4/8 attention $kernel on both sides -> $results/versus-$kernel" >&2
    "$py" -m genbatch.benchmark.versus --suite "$suite" --device "$device" --out "$results/versus-$kernel" \
        --attention "$kernel" || status=$?
done
took "step 4"
fi

image_suite=$([ "$suite" = tiny ] && echo tiny-flux || echo flux)
if want 5; then
echo "== 5/8 $image_suite: genbatch vs diffusers FluxPipeline, eager then compiled ($compile_backend) -> $results/versus-flux*" >&2
"$py" -m genbatch.benchmark.versus --suite "$image_suite" --device "$device" --out "$results/versus-flux" || status=$?
"$py" -m genbatch.benchmark.versus --suite "$image_suite" --device "$device" --out "$results/versus-flux-compiled" \
    --compile-backend "$compile_backend" || status=$?
took "step 5"
fi

batch_cases=$([ "$suite" = tiny ] && echo tiny-flux || echo "flux.1-dev-512 flux.1-dev-1024")
if want 6; then
echo "== 6/8 batched rows ($batch_cases) -> $results/batching.txt" >&2
# shellcheck disable=SC2086
"$py" bench/batching.py --cases $batch_cases --steps "$([ "$suite" = tiny ] && echo 1 || echo 4)" \
    > "$results/batching.txt" || status=$?
cat "$results/batching.txt" >&2
took "step 6"
fi

if want 7; then
# at tiny size on a CPU the step stands in for one GPU (--max-ranks 1): the one-process pairings, the rest not run
parallel_args=(--scale gpu --device "$device" --attention cudnn --rounds 2 --jobs 2)
if [ "$suite" = tiny ]; then parallel_args=(--scale tiny --device "$device" --max-ranks 1 --rounds 1 --jobs 1); fi
echo "== 7/8 genbatch vs diffusers' own parallelism (enable_parallelism), the layouts that fit here -> $results/versus-parallel" >&2
"$py" bench/versus_parallel.py "${parallel_args[@]}" --out "$results/versus-parallel" || status=$?
took "step 7"
fi

if want 8; then
# FLUX.1-dev's bf16 compiled step is step 5's; its load is the longest, so it runs four variants, Wan five
quantized_suites=$([ "$suite" = tiny ] && echo tiny,tiny-flux || echo gpu,flux:none+fp8+int8+fp8-compiled)
variants=$([ "$suite" = tiny ] && echo none,fp8,fp8-compiled || echo none,fp8,int8,none-compiled,fp8-compiled)
echo "== 8/8 quantized weights ($quantized_suites: $variants) -> $results/quantization" >&2
"$py" bench/quantization.py --suites "$quantized_suites" --device "$device" --rows 1 \
    --steps "$([ "$suite" = tiny ] && echo 2 || echo 4)" --compile-backend "$compile_backend" --variants "$variants" \
    --out "$results/quantization" || status=$?
rm -rf "$results"/quantization/*/*/run/outputs   # the media: not results
took "step 8"
fi

rm -rf "$results/suite/runs" "$results"/versus*/*-[0-9]*/run/outputs   # the videos: not results
echo "bench/gpu.sh: done in $((SECONDS - started)) s; results in $results (suite report: $results/suite/report.md)" >&2
exit "$status"
