"""Tensor parallelism for the denoisers: the family's `TensorSplits` applied with torch's `parallelize_module`.

    styles.py   the splits' styles as torch ParallelStyles (ColwiseParallel / RowwiseParallel), with the
                row-wise all-reduce and the AdaLN all-gather issued through the counted collectives
    norm.py     Wan's QK RMSNorm across heads on a tp shard of the heads: the mean square all-reduced
    shard.py    resolving a plan on one transformer (diffusers' `_tp_plan` plus the family's styles),
                checking every split divides, and applying it
    loading.py  this rank's slice of a full tensor for a tp-sharded parameter (filling a meta-built
                skeleton under `--fsdp`)
    checkpoint.py  filling a split meta-built skeleton from a component's safetensors, each rank reading only
                its own blocks (`--tp` from a pipeline directory)
    encoders.py `--text-encoder-parallel`: which text encoders split over the job group (the same splits
                and styles, the family's `text_encoder_splits`)

diffusers' own entry points (`enable_parallelism`, `from_pretrained(parallel_config=...)`) refuse CPU meshes,
so genbatch calls torch directly; the splits stay data in the family modules (`genbatch.models`).
"""
