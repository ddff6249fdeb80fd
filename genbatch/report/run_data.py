"""A run folder as the report sees it: one `JobView` per results row, the run's info and its timings.

    data = load_run(store)     RunData(info, jobs, timings, manifest_rows)

The rows come from `RunStore.collect_results` (the done and failed markers and the rejected rows, as the results
table would hold them now), so a report of a run still running shows what is done so far. A job's layout is
the one its timing rows name (the run's layout when they name none). Pending jobs are counted, not listed: the
manifest's rows (its Parquet footer, nothing else is read) less the rows that have a result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa

from genbatch.io.stage_names import COMPRESS, current_stage

STATUSES = ("done", "failed", "rejected")
"""The statuses a results row can have, in the order the report shows them."""

STAGE_ORDER = ("download", "load", "adapters", "text_encode", "vae_encode", "denoise", "vae_decode", COMPRESS, "write")
"""The order stages are shown in (a stage not named here follows, in the results' column order)."""

STAGE_SUFFIX = "_s"
"""A results column `<stage>_s` holds the seconds the job spent in that stage (text_encode_s, denoise_s, ...)."""


@dataclass(kw_only=True, slots=True)
class JobView:
    """One job of the results table, with what its card shows."""

    id: str
    """The manifest row's id (for a rejected row without a usable id: `row N`)."""
    status: str
    """done, failed or rejected."""
    row: int | None = None
    """The manifest row number."""
    model: str | None = None
    prompt: str | None = None
    negative_prompt: str | None = None
    """The row's negative prompt (None when it had none)."""
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    """Frames of a video job (None for an image)."""
    fps: int | None = None
    steps: int | None = None
    guidance: float | None = None
    layout: str | None = None
    """The parallel layout the job ran under (`ParallelDims.name`: single, ulysses2, ...)."""
    lora: str | None = None
    cache: str | None = None
    approximation: str | None = None
    """`exact`, or the attention approximation the job ran under (stale K/V)."""
    vae_decode: str | None = None
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage, in STAGE_ORDER (text_encode, denoise, vae_decode, compress, then any other); a run
    written before a stage was renamed shows it under today's name (`io.stage_names`)."""
    error: str | None = None
    """Why a failed job failed or a rejected row was rejected."""
    output_ext: str | None = None
    """The output's extension (png, mp4) of a done job."""
    output_sha256: str | None = None
    audio_sample_rate: int | None = None
    """The sample rate of a video's sound track (None: a silent output)."""
    audio_seconds: float | None = None
    """How long the sound lasts."""

    @property
    def is_video(self) -> bool:
        return self.output_ext == "mp4"

    @property
    def has_sound(self) -> bool:
        """True when the video carries a sound track (its results row names the track's sample rate)."""
        return self.is_video and bool(self.audio_sample_rate)


@dataclass(kw_only=True, slots=True)
class RunData:
    """Everything a report is made from."""

    url: str
    """The run folder's URL."""
    info: dict | None
    """run.json (the latest attempt's), or None for a run that wrote none."""
    jobs: list[JobView]
    """Every results row, in manifest order."""
    timings: pa.Table
    """Every timing row of every rank and attempt."""
    manifest_rows: int | None
    """Rows of the run's manifest, or None when it cannot be read (then pending is unknown)."""

    def counts(self) -> dict[str, int | None]:
        """done / failed / rejected, and pending (None when the manifest's size is unknown)."""
        counts: dict[str, int | None] = {status: 0 for status in STATUSES}
        for job in self.jobs:
            counts[job.status] += 1
        counts["pending"] = None if self.manifest_rows is None else max(0, self.manifest_rows - len(self.jobs))
        return counts

    def models(self) -> list[str]:
        """The models of the listed jobs, sorted."""
        return sorted({job.model for job in self.jobs if job.model})


def _text(value) -> str | None:
    return None if value is None or value == "" else str(value)


def lora_label(text: str | None) -> str | None:
    """A results row's `lora` (`jobs.lora.lora_text`: a JSON list of adapters) as one short line:
    `org/fast@main (w.safetensors) x 0.8, ./style x 1.0 [low]`; text that is not such a list is kept."""
    if not text:
        return None
    try:
        entries = json.loads(text)
    except ValueError:
        return text
    if not isinstance(entries, list) or not all(isinstance(entry, dict) and "uri" in entry for entry in entries):
        return text
    return ", ".join(f"{entry['uri']}" + (f" ({entry['weight_name']})" if entry.get("weight_name") else "")
                     + f" x {entry.get('scale', 1.0):g}" + (f" [{entry['expert']}]" if entry.get("expert") else "")
                     for entry in entries)


def _job_layouts(timings: pa.Table) -> dict[str, str]:
    """Per job id, the layout its last timing row names."""
    if timings.num_rows == 0 or not {"job_id", "layout"} <= set(timings.column_names):
        return {}
    return dict(zip(timings["job_id"].to_pylist(), timings["layout"].to_pylist(), strict=True))


def job_views(results: pa.Table, layouts: dict[str, str], run_layout: str | None) -> list[JobView]:
    """One JobView per results row (rows missing a column get None for it)."""
    names = results.column_names
    stage_columns = [name for name in names if name.endswith(STAGE_SUFFIX)
                     and pa.types.is_floating(results.schema.field(name).type)]
    known = {stage: index for index, stage in enumerate(STAGE_ORDER)}
    stage_columns.sort(key=lambda name: known.get(current_stage(name[: -len(STAGE_SUFFIX)]), len(known)))  # stable
    columns = {name: results[name].to_pylist() for name in names}
    missing = [None] * results.num_rows

    def column(name):
        return columns.get(name, missing)

    views = []
    for i, (job_id, status) in enumerate(zip(column("id"), column("status"), strict=True)):
        row = column("row")[i]
        uri = column("output_uri")[i] if status == "done" else None
        ext = uri.rsplit(".", 1)[-1].lower() if uri and "." in uri.rsplit("/", 1)[-1] else None
        stages = {current_stage(name[: -len(STAGE_SUFFIX)]): columns[name][i] for name in stage_columns
                  if columns[name][i] is not None}
        job_id = job_id if job_id else f"row {row}"
        views.append(JobView(
            id=job_id, status=status, row=row, model=_text(column("model")[i]), prompt=_text(column("prompt")[i]),
            negative_prompt=_text(column("negative_prompt")[i]), seed=column("seed")[i], width=column("width")[i], height=column("height")[i],
            num_frames=column("num_frames")[i], fps=column("fps")[i], steps=column("num_inference_steps")[i],
            guidance=column("guidance_scale")[i],
            layout=layouts.get(job_id, run_layout if status != "rejected" else None),
            lora=lora_label(_text(column("lora")[i])), cache=_text(column("cache")[i]),
            approximation=_text(column("attention_approximation")[i]), vae_decode=_text(column("vae_decode")[i]),
            stages=stages, error=_text(column("error")[i]), output_ext=ext,
            output_sha256=_text(column("output_sha256")[i]), audio_sample_rate=column("audio_sample_rate")[i],
            audio_seconds=column("audio_seconds")[i],
        ))
    return views


def manifest_rows(url: str | None, storage_options: dict | None) -> int | None:
    """The manifest's row count from its Parquet footer; None when it cannot be read."""
    if not url:
        return None
    from genbatch.manifests import ManifestFileError, ManifestReader

    try:
        with ManifestReader(url, storage_options=storage_options) as reader:
            return reader.rows
    except (ManifestFileError, OSError):
        return None


def load_run(store, storage_options: dict | None = None) -> RunData:
    """The run in `store` (a `genbatch.io.RunStore`); a folder with no run in it raises FileNotFoundError."""
    info = store.read_run_info()
    results = store.collect_results()
    if info is None and results.num_rows == 0:
        raise FileNotFoundError(f"{store.url} holds no run (no run.json, no done, failed or rejected rows): "
                                "pass the --out of a `gen run`")
    timings = store.read_timings()
    views = job_views(results, _job_layouts(timings), (info or {}).get("layout"))
    return RunData(url=store.url, info=info, jobs=views, timings=timings,
                   manifest_rows=manifest_rows((info or {}).get("manifest"), storage_options))
