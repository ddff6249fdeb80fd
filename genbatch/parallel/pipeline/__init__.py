"""PipeFusion's layer pipeline: the repeated blocks cut into stages over the pp axis, activations sent stage to
stage point to point, the prediction returned from the last stage.

    stages      the cut (`cut_stages`) and the point-to-point joins of one cut model (`StageLink`)
    patches     the hooks that make a forward a patch forward (`PatchHooks`)
    strategy    the `pipefusion` attention strategy over the stage's sequence ranks and the stale K/V
    state       `PipeState`: one denoiser's K/V buffers and patch of one job
    regions     the per-patch schedulers of the asynchronous steps
    session     `PipeSession`: one job's states, the feature's `JobHook` (`genbatch.parallel.job_hooks`)
    steps       the asynchronous steps the session runs itself: one forward per patch, the latent sent back
"""
