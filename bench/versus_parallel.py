"""genbatch's parallel layouts against diffusers' own parallelism (`enable_parallelism`) on the same directory
and rows, the same ranks, each side launched by torchrun: seconds a step and a job, peak memory and bytes sent
per rank, PSNR against the one-process output, ratios genbatch / diffusers printed. Everything is in
`genbatch.benchmark.versus_parallel` (its docstring says what is measured and how).

    python bench/versus_parallel.py --scale cpu --rounds 2 --out bench/results/cpu/versus_parallel-DATE
    python bench/versus_parallel.py --scale gpu --out DIR         # bench/gpu.sh step 7
    python bench/versus_parallel.py --scale tiny --rounds 1 --out /tmp/v
    python bench/versus_parallel.py --out DIR --reprint           # summarize DIR again
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from genbatch.benchmark.versus_parallel import main  # noqa: E402  (genbatch from this checkout)

if __name__ == "__main__":
    sys.exit(main())
