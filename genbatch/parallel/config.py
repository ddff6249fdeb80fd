"""ParallelizeConfig: the run's settings the parallelisation order applies, bundled in one typed config that
travels from the CLI (`RunOptions.parallelize_config`) through start-up (`World.parallelize`) and loading to
`parallel/apply.py`, in the style of torchtitan's job config. Imports nothing heavy.

    compile        step 4: how the family's compile units compile (None: eager)
    attention      step 2: the attention kernel, as `--attention` spells it
    text_encoders  step 2 and 5: `--text-encoder-parallel`, how the text encoders run over a job group
    cache          step 3: the run's default step cache (`--cache`; a row may set its own), hooked per job
    quantization   step 2b: `--quantization` and `--quantize-text-encoder` (`genbatch.jobs.quantization`)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from genbatch.jobs.quantization import Quantization
from genbatch.parallel.flags import ATTENTION_KERNELS

if TYPE_CHECKING:
    from genbatch.parallel.compile import CompileConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelizeConfig:
    compile: CompileConfig | None = None
    """How step 4 compiles the compile units (None: the denoisers run eagerly)."""
    attention: str = "auto"
    """`--attention`: the kernel's name as the flag spells it (`genbatch.parallel.flags.ATTENTION_KERNELS`)."""
    text_encoders: str = "auto"
    """`--text-encoder-parallel` (`genbatch.parallel.tensor.encoders.MODES`)."""
    cache: str | None = None
    """The run's default step cache (`--cache`, `genbatch.jobs.cache`); None: none. Step 3 hooks each job's own
    (`genbatch.parallel.cache.StepCache`); a TaylorSeer cache makes step 4 compile with graph breaks."""
    quantization: Quantization = Quantization()
    """What step 2b quantizes (`genbatch.parallel.quantize`): the denoisers' Linear layers to fp8 or int8, and the
    text encoders' too when asked; `none` leaves every weight in the run's dtype."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KERNELS:
            raise ValueError(f"--attention {self.attention!r} is not one of {', '.join(ATTENTION_KERNELS)}")

    @property
    def caches_steps(self) -> bool:
        """True when the run's default step cache is a mode that skips steps (not `none`)."""
        from genbatch.jobs.cache import NONE, parse_cache

        return parse_cache(self.cache).kind != NONE

    @property
    def attention_backend(self) -> str:
        """The local attention backend of `attention` (`genbatch.parallel.attention.local.KERNELS`)."""
        from genbatch.parallel.attention.local import KERNELS

        return KERNELS[self.attention]
