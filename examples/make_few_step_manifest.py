"""Write the few-step example manifest: Wan 2.1 text-to-video rows that run a step- and CFG-distilled LoRA
(LightX2V's, as Kijai/WanVideo_comfy ships it) at 4 steps and guidance 1, beside two rows of the base model's
own recipe to compare with.

    python examples/make_few_step_manifest.py [OUT]       # default: examples/few_step_wan.parquet
    gen run examples/few_step_wan.parquet --out runs/fast --model Wan-AI/Wan2.1-T2V-14B-Diffusers --ulysses 8

The adapter is a hub id with a `weight_name`: `gen run` downloads that one file of the repository (one rank
per node, with `--download`) and resolves it offline from the Hugging Face cache as `--model` ids are. The
rows name no model, so any Wan 2.1 T2V 14B pipeline (a directory or a hub id) given by `--model` runs them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DISTILLED = [{"uri": "Kijai/WanVideo_comfy", "scale": 1.0,
              "weight_name": "Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32.safetensors"}]
"""LightX2V's Wan 2.1 T2V 14B step- and CFG-distillation LoRA (rank 32), in the original Wan layout."""

SCHEMA = pa.schema([
    ("id", pa.string()),
    ("prompt", pa.string()),
    ("width", pa.int64()),
    ("height", pa.int64()),
    ("num_frames", pa.int64()),
    ("num_inference_steps", pa.int64()),
    ("guidance_scale", pa.float64()),
    ("seed", pa.int64()),
    ("lora", pa.list_(pa.struct([("uri", pa.string()), ("scale", pa.float64()), ("weight_name", pa.string())]))),
])

PROMPTS = {
    "fox": "a red fox running through snow, morning light",
    "harbor": "fishing boats in a harbor at dusk, gulls overhead",
    "market": "a busy night market in the rain, neon signs reflected in puddles",
    "forest": "sunlight through a pine forest, slow dolly forward",
}


def rows() -> list[dict]:
    """Each prompt at 4 steps with the LoRA and no CFG; the first two also at the base model's 50 steps,
    guidance 5, with no adapter (an empty list), the same seed: the pair `gen bench --lora` scores."""
    video = {"width": 832, "height": 480, "num_frames": 81}
    fast = [{"id": f"fast-{name}", "prompt": prompt, **video, "num_inference_steps": 4, "guidance_scale": 1.0,
             "seed": 100 + index, "lora": DISTILLED} for index, (name, prompt) in enumerate(PROMPTS.items())]
    base = [{"id": f"base-{name}", "prompt": prompt, **video, "num_inference_steps": 50, "guidance_scale": 5.0,
             "seed": 100 + index, "lora": []} for index, (name, prompt) in enumerate(list(PROMPTS.items())[:2])]
    return fast + base


def main(out: str | None = None) -> Path:
    path = Path(out) if out else Path(__file__).resolve().parent / "few_step_wan.parquet"
    pq.write_table(pa.Table.from_pylist(rows(), schema=SCHEMA), path)
    return path


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
