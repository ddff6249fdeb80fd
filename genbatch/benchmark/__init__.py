"""genbatch.benchmark: `gen bench`, nightly throughput runs with a report and a regression verdict.

    suites.py    the suites (tiny, cpu, gpu): a model, a fixed manifest, the layouts to time
    layouts.py   layout names (`single`, `dp2`, `cfg2-ulysses2`, ...) <-> `gen run` flags
    models.py    the benchmark models (random weights), built once into a cache directory
    execute.py   `gen run` once per layout, timed, its timings tagged with the layout
    metrics.py   timings -> seconds per step, stages, jobs per hour, efficiency against one rank
    compare.py   metrics against a baseline report: change per metric, regressions
    markdown.py, plots.py, report.py   the report written to OUT
    nightly.py   the whole `gen bench` (and its exit status); cli.py its arguments
    versus.py    genbatch against the plain diffusers pipeline on one device (bench/gpu.sh)
    versus_parallel.py  genbatch's layouts against diffusers' own `enable_parallelism`, the same ranks
                 (bench/versus_parallel.py); parallel_sides.py one rank of either side under torchrun;
                 collective_bytes.py the bytes a peer's torch.distributed calls send, counted from outside
"""
