import subprocess
import sys

import pytest

from genbatch.jobs.seeds import INT64_MAX, job_seed, seed_from_id

# sha256(b"cat-001")[:8] big-endian, masked to 63 bits; computed once, must never change (resumed and
# rerun jobs must draw the same noise).
GOLDEN = {"cat-001": 2771272577348618636, "": 7183457195969485844, "héllo": 4343819824053979717}


def test_seed_from_id_golden_values():
    for job_id, seed in GOLDEN.items():
        assert seed_from_id(job_id) == seed


def test_seed_from_id_is_stable_across_processes_with_different_hash_seeds():
    code = "from genbatch.jobs.seeds import seed_from_id; print(seed_from_id('cat-001'))"
    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        result = subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
        )
        outputs.add(int(result.stdout))
    assert outputs == {GOLDEN["cat-001"]}


def test_derived_seeds_are_non_negative_int64_and_distinct():
    seeds = {seed_from_id(f"job-{i}") for i in range(10_000)}
    assert len(seeds) == 10_000
    assert all(0 <= seed <= INT64_MAX for seed in seeds)


def test_job_seed_prefers_the_rows_own_seed():
    assert job_seed(0, "cat-001") == 0
    assert job_seed(-5, "cat-001") == -5
    assert job_seed(None, "cat-001") == GOLDEN["cat-001"]
    with pytest.raises(ValueError, match="int64"):
        job_seed(2**63, "cat-001")
