"""Write the shipped example manifest: tiny-wan video rows, a tiny-wan-i2v image-to-video row, a tiny-flux-kontext
and a tiny-qwen-image-edit edit row, tiny-flux image rows, a tiny-z-image row (Turbo's guidance 0), a
tiny-qwen-image-21 row conditioned on the image, a tiny-ltx2 video-with-sound row, a tiny-flux2 and a
tiny-flux2-klein row and a HunyuanVideo 1.5 text-to-video and image-to-video row, small enough for a CPU, and the
image the image-to-video, edit and conditioned rows start from (examples/images/).

    python examples/make_manifest.py [OUT]                   # default: examples/manifest.parquet by this script
    gen validate examples/manifest.parquet --model tiny-wan  # check it
    gen run examples/manifest.parquet --out runs/example --model tiny-wan

Rows without `model` run on the run's `--model` (here the tiny-wan preset; there is no default model, so a
manifest with such rows needs one); null settings take the run-level option or the model's default; a null
`seed` is derived from the row's `id`. The `image` column is a path relative to the manifest's directory.
`num_outputs` 2 makes the owl row two jobs, `flux-owl-0` and `flux-owl-1`, each with its own seed.
`category` and `priority` are extra columns: genbatch carries them into the results table untouched.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("prompt", pa.string()),
        ("negative_prompt", pa.string()),
        ("model", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("num_frames", pa.int64()),
        ("num_inference_steps", pa.int64()),
        ("guidance_scale", pa.float64()),
        ("seed", pa.int64()),
        ("fps", pa.int64()),
        ("image", pa.string()),
        ("num_outputs", pa.int64()),
        ("category", pa.string()),
        ("priority", pa.int32()),
    ]
)

ROWS = [
    dict(id="wan-fox", prompt="a red fox running through snow", seed=42, category="animals", priority=1),
    dict(id="wan-river", prompt="a river at dawn, mist over the water", num_frames=5, fps=4, category="landscape"),
    dict(
        id="wan-city",
        prompt="a city street at night in the rain",
        negative_prompt="blurry",
        width=48,
        height=32,
        num_inference_steps=4,
        category="urban",
        priority=3,
    ),
    dict(id="i2v-lighthouse", prompt="waves breaking below a lighthouse", model="tiny-wan-i2v",
         image="images/lighthouse.png", num_frames=5, num_inference_steps=4, category="landscape"),
    dict(id="edit-lighthouse", prompt="the lighthouse at sunset", model="tiny-flux-kontext",
         image="images/lighthouse.png", num_inference_steps=4, category="landscape"),
    dict(id="qwen-edit-lighthouse", prompt="the lighthouse in winter", negative_prompt="blurry",
         model="tiny-qwen-image-edit", image="images/lighthouse.png", num_inference_steps=4, category="landscape"),
    dict(id="zimage-lantern", prompt="a paper lantern floating over a dark lake", model="tiny-z-image",
         guidance_scale=0.0, num_inference_steps=4, category="landscape"),
    dict(id="qwen21-lighthouse", prompt="the lighthouse under the northern lights", model="tiny-qwen-image-21",
         image="images/lighthouse.png", num_inference_steps=4, category="landscape"),
    dict(id="hunyuan15-sign", prompt='a fox holding a sign that says "HELLO"', negative_prompt="blurry",
         model="tiny-hunyuan-video-15", width=48, height=32, num_frames=5, num_inference_steps=2, category="animals"),
    dict(id="hunyuan15-i2v-lighthouse", prompt="waves breaking below a lighthouse", model="tiny-hunyuan-video-15-i2v",
         image="images/lighthouse.png", num_frames=5, num_inference_steps=2, category="landscape"),
    dict(id="flux-apple", prompt="a green apple on a wooden table", model="tiny-flux", seed=7, category="still life"),
    dict(
        id="flux-house",
        prompt="a small house on a hill",
        model="tiny-flux",
        width=48,
        height=32,
        guidance_scale=4.0,
        category="landscape",
        priority=2,
    ),
    dict(id="flux-owl", prompt="an owl in a pine tree", model="tiny-flux", num_inference_steps=4, num_outputs=2,
         category="animals"),
    dict(id="ltx2-waves", prompt="waves on a pebble beach, the sound of the surf", model="tiny-ltx2", width=64,
         height=64, num_frames=9, num_inference_steps=4, category="landscape"),
    dict(id="flux2-lantern", prompt="a paper lantern glowing over a night market", model="tiny-flux2",
         num_inference_steps=4, category="urban"),
    dict(id="klein-teapot", prompt="a blue ceramic teapot on a windowsill", model="tiny-flux2-klein",
         num_inference_steps=4, category="still life"),
]


def example_table() -> pa.Table:
    """The example manifest as an Arrow table (columns missing from a row are null)."""
    return pa.Table.from_pylist([{name: row.get(name) for name in SCHEMA.names} for row in ROWS], schema=SCHEMA)


def write_image(path: Path) -> None:
    """A 64x48 picture to start a video from: sky, sea and a white tower (drawn, so the script makes it)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 48), (120, 170, 230))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 30, 63, 47), fill=(20, 60, 120))
    draw.rectangle((40, 10, 46, 30), fill=(245, 245, 240))
    draw.polygon([(38, 10), (48, 10), (43, 4)], fill=(200, 30, 30))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def main(out: str | None = None) -> Path:
    path = Path(out) if out else Path(__file__).resolve().parent / "manifest.parquet"
    pq.write_table(example_table(), path)
    write_image(path.parent / "images" / "lighthouse.png")
    return path


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
