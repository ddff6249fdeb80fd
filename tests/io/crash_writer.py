"""Child process for the crash tests: commit jobs job-00..job-NN (skipping done ones) until all are done.

    python -m tests.io.crash_writer URL OPTIONS_JSON JOBS MEDIA_BYTES

The media of a job is a pure function of its id (`media_for`), so the parent can check every output.
"""

from __future__ import annotations

import hashlib
import json
import sys


def media_for(job_id: str, size: int) -> bytes:
    block = hashlib.sha256(job_id.encode()).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def job_ids(count: int) -> list[str]:
    return [f"job-{i:02d}" for i in range(count)]


def main(url: str, options_json: str, count: int, size: int) -> None:
    from genbatch.io import BackgroundWriter, RunStore

    store = RunStore(url, json.loads(options_json))
    done = store.done_ids()
    with BackgroundWriter(max_pending=2) as writer:
        for job_id in job_ids(count):
            if job_id not in done:
                print("start", job_id, flush=True)  # the parent kills at a random point after one of these
                store.save_checkpoint(job_id, media_for(job_id, size // 4))
                writer.submit(store.commit, job_id, media_for(job_id, size), "mp4", {"job": job_id})
                writer.submit(store.delete_checkpoint, job_id)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
