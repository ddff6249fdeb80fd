"""Patch parallelism over stale K/V: each rank computes one patch of the latent and attends to the other patches'
keys and values of the step before (DistriFusion), after synchronous warm-up steps that are exact. The run's
settings (`StaleConfig`: the method, its patches and warm-up steps, its label) are in `genbatch.parallel.stale`.

    state       `StaleState`: one denoiser's K/V buffers of one job, by guidance branch and attention call
    strategies  the attention strategies (`distrifusion`, and `naive_patch`, the baseline that attends to its
                own patch only), registered beside `exact`
    session     `StaleSession`: one job's states, the feature's `JobHook` (`genbatch.parallel.job_hooks`)
    fit         the K/V memory a layout needs per rank, as a pure function (a row that does not fit is rejected)
"""
