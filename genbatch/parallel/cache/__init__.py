"""Step caching that is safe under parallelism: the modes' hooks and their cross-rank decisions.

The mode grammar (`none`, `fbc:THRESHOLD`, `taylorseer:INTERVAL`, `teacache:THRESHOLD`) is plain data in `genbatch.jobs.cache`,
so the manifest can check a row's `cache` value; this package runs a parsed mode on a job's denoisers:

    agreement.py    which ranks must decide together (`decision_comm`) and the exact, reduced indicator
    fbc.py          diffusers' First-Block-Cache hooks with the head block's per-rank decision replaced by
                    the group's agreed one
    taylorseer.py   diffusers' TaylorSeer hooks on the family's attention and feed-forward modules (its
                    schedule is a function of the step, so every rank agrees by construction)
    teacache.py     TeaCache (not in diffusers): the accumulated, rescaled change of the first block's
                    modulated input, agreed like FBC's, skips every block; the covered models and their
                    published coefficients are data in `genbatch.models.teacache`
    session.py      `StepCache`: one job's hooks, installed when the job starts and removed when it ends (so
                    state never crosses jobs), the per-branch cache contexts, the per-step skipped count;
                    the feature's `JobHook` (`genbatch.parallel.job_hooks`)

The hooks replace each block's `forward` (diffusers' HookRegistry), whatever that forward is: under
`--compile` it is the compiled forward, so the hooks sit outside the compiled regions and add no graph
break inside a block. Sequence-parallel splits are forward pre-hooks, which run before the replaced forward,
so the cache sees this rank's shard, and the cached residuals are shards too.
"""
