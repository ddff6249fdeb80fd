"""What the resume tests read back from a run (local or S3, through RunStore) and how they wait on one."""

from __future__ import annotations

import hashlib
import re
import time
from collections import defaultdict

from genbatch.io import RunStore, decode_mp4
from genbatch.io.layout import encode_id
from genbatch.runner.checkpoint import DenoiseCheckpoint
from tests.support.runs import run_cli, write_manifest


def wait_until(condition, process, timeout_s: float = 120.0, what: str = "the run") -> None:
    """Poll `condition()` until true; fail if `process` ends first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            _, stderr = process.communicate()
            raise AssertionError(f"{what} ended (exit {process.returncode}) before the test could act:\n{stderr}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: condition not met within {timeout_s} s")
        time.sleep(0.02)


def outputs(store: RunStore) -> dict[str, bytes]:
    """Every output of the run by name: PNG bytes, or an MP4's decoded frames (encoder metadata aside)."""
    folder = store.layout.join("outputs")
    found = {}
    for name in store.objects.list_names(folder):
        data = store.objects.read(f"{folder}/{name}")
        found[name] = decode_mp4(data).tobytes() if name.endswith(".mp4") else data
    return found


def checkpoint_steps(store: RunStore) -> dict[str, int]:
    """steps_done of every checkpoint in the run, by job id."""
    names = store.objects.list_names(store.layout.join("checkpoints"))
    found = {}
    for name in names:
        job_id = name.removesuffix(".ckpt")
        payload = store.load_checkpoint(job_id)
        if payload is not None:  # None: its job was committed since the listing
            found[job_id] = DenoiseCheckpoint.from_bytes(payload).steps_done
    return found


def steps_by_attempt(store: RunStore) -> dict[str, dict[str, dict[int, list[int]]]]:
    """{job id: {attempt (run_id): {rank: denoising step indices in the order timed}}} from the run's
    timings (every rank of a job group times the steps it took part in)."""
    found: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for row in sorted(store.read_timings().to_pylist(), key=lambda row: row["start"]):
        if row["stage"] == "denoise_step":
            found[row["job_id"]][row["run_id"]][row["rank"]].append(row["step"])
    return {job: {attempt: dict(ranks) for attempt, ranks in by.items()} for job, by in found.items()}


def encoded_by_attempt(store: RunStore) -> dict[str, set[str]]:
    """{attempt: ids of the jobs whose media it encoded} (each job's media is encoded by its group leader)."""
    found: dict[str, set[str]] = defaultdict(set)
    for row in store.read_timings().to_pylist():
        if row["stage"] == "compress":
            found[row["run_id"]].add(row["job_id"])
    return dict(found)


def manifest_and_reference(tmp_path_factory, rows: list[dict]) -> tuple[str, dict[str, bytes]]:
    """A local manifest of `rows` and the outputs of its uninterrupted run in this process."""
    root = tmp_path_factory.mktemp("uninterrupted")
    manifest = write_manifest(str(root / "m.parquet"), rows)
    return manifest, reference_outputs(manifest, str(root / "reference"))


def reference_outputs(manifest: str, out: str, *args: str) -> dict[str, bytes]:
    """Run the manifest uninterrupted in this process; its outputs (see `outputs`)."""
    result = run_cli("run", manifest, "--out", out, "-q", *args)
    assert result.returncode == 0, result.stderr
    return outputs(RunStore(out))


_RUN_FILES = re.compile(r"(timings/[^/.][^/]*\.parquet|results/results\.parquet|rejected/rejected\.parquet"
                        r"|run\.json|attempts/[^/.][^/]*\.json)")


def leftovers(store: RunStore, ids: set[str]) -> list[str]:
    """What a finished run of `ids` must not hold: anything but one output and one done marker per job and
    the run's tables (so: checkpoints, failure records, temp files, stray outputs), and done markers whose
    output is missing or differs from the bytes they name."""
    root = store.layout.root
    names = {encode_id(job_id) for job_id in ids}
    markers = {f"done/{name}.json" for name in names}
    outputs_of: dict[str, list[str]] = defaultdict(list)
    found = []
    for path in store.fs.find(root):
        relative = path[len(root) + 1:]
        stem, _, ext = relative.removeprefix("outputs/").rpartition(".")
        if relative.startswith("outputs/") and stem in names and ext in ("png", "mp4"):
            outputs_of[stem].append(relative)
        elif relative not in markers and not _RUN_FILES.fullmatch(relative):
            found.append(relative)
    found += [f"several outputs of one job: {paths}" for paths in outputs_of.values() if len(paths) > 1]
    for job_id in store.done_ids():
        record = store.read_done(job_id)
        data = store.objects.read(root + record["output_uri"][len(store.url):])
        if data is None or hashlib.sha256(data).hexdigest() != record["output_sha256"]:
            found.append(f"done marker of {job_id} names an output that is missing or differs")
    return sorted(found)
