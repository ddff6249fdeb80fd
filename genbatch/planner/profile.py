"""A calibration profile: the cost model's free parameters, fitted to one machine's measured steps.

The cost model (`genbatch.planner.cost`) prices a step from published figures: the GPU's peak times an
assumed efficiency, a fixed cost per layer, each link's bandwidth. A profile replaces the figures it
measured and leaves the rest. With a profile, one step of a layout costs

    slowdown x [linear_flops / (gemm_tflops x rows / (rows + gemm_half_rows))
                                      + attention_flops / attention_tflops]
    + layer_forwards x layer_overhead_s + sum over collective kinds of (bytes / bandwidth + messages x latency)

where on a CPU `slowdown = max(1, ranks / cpu_cores) x (1 + core_sharing (min(ranks, cpu_cores) - 1))` (ranks
beyond the cores time-slice them; 1 on GPUs), and the bytes of the bulk-copy kinds (FSDP's all-gathers, the
ring's passes: `cost.COPY_BOUND_KINDS`) take `max(1, ranks / cpu_cores)` longer too.

GEMM efficiency against rows per rank is the saturating form `rows / (rows + gemm_half_rows)`: linear layers
reach `gemm_tflops` on large GEMMs and half of it at `gemm_half_rows` rows per rank. Every term is linear in
the inverse throughputs, so a least-squares fit recovers them (`genbatch.planner.calibrate`).

Profiles are JSON files (`SCHEMA` below), kept by default under the user's config directory:
`$XDG_CONFIG_HOME/genbatch/profiles/NAME.json`, else `~/.config/genbatch/profiles/NAME.json`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields

from genbatch.parallel.axes import AXIS

SCHEMA = 1
"""The profile file's schema version (bumped when a field changes meaning or goes away)."""

COLLECTIVE_OF_AXIS = {
    **{axis.name: axis.collective for axis in AXIS.values() if axis.collective},  # the axis table's own
    "fsdp": "fsdp_all_gather",  # FSDP's weight all-gathers (over a sub-mesh, not an axis)
    "sp_gather": "sp_gather",   # the output gather at the end of a sequence-parallel forward
}
"""The byte ledger's collective kind (`bytes_KIND` in the timings) each of the cost model's terms sends."""


@dataclass(kw_only=True, slots=True)
class Profile:
    """Fitted parameters of the cost model for one machine; None keeps the published figure."""

    name: str
    """What the profile is called (its file name without `.json` when saved by name)."""
    device: str
    """What it was measured on: a `--gpu` name (`h100`, ...) or `cpu`."""
    gemm_tflops: float | None = None
    """Achieved TFLOP/s of large linear layers (the asymptote of the GEMM efficiency curve)."""
    gemm_half_rows: float | None = None
    """Rows per rank at which linear layers reach half of `gemm_tflops`."""
    attention_tflops: float | None = None
    """Achieved TFLOP/s of attention."""
    layer_overhead_s: float | None = None
    """Fixed seconds per layer and forward that no axis shrinks (the fixed cost per step, over layer-forwards)."""
    bandwidth_gbs: dict[str, float] = field(default_factory=dict)
    """Effective GB/s by `LINK/KIND` (`nvlink/all_to_all`, `gloo/sp_gather`): measured bytes over the seconds
    they added to a step beyond latency, lost overlap included. Links and kinds not here keep published figures."""
    latency_s: dict[str, float] = field(default_factory=dict)
    """Seconds per collective by `LINK/KIND`, fitted beside its bandwidth (a kind without one keeps the link's)."""
    core_sharing: float | None = None
    """On a CPU, how much ranks with cores of their own still slow each other (memory bandwidth, caches): each
    rank's compute takes (1 + core_sharing x (ranks - 1)) times as long, for up to `cpu_cores` ranks. None on GPUs."""
    cpu_cores: int | None = None
    """On a CPU, the cores its runs had: more ranks than these time-slice them (`ranks / cpu_cores` slower
    again). None: the `core_sharing` term alone over every rank (profiles made before it was recorded)."""
    fit: dict = field(default_factory=dict)
    """How it was fitted: the runs, steps used, residuals, and which parameters kept their prior."""

    def bandwidth(self, link: str, kind: str) -> float | None:
        """The measured GB/s of `kind` over `link`, or None when it was not measured."""
        return self.bandwidth_gbs.get(f"{link}/{kind}")

    def latency(self, link: str, kind: str) -> float | None:
        """The measured seconds per collective of `kind` over `link`, or None when it was not measured."""
        return self.latency_s.get(f"{link}/{kind}")

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "profile") -> "Profile":
        """A profile from its JSON data; ValueError naming what is wrong and the fix."""
        if not isinstance(data, dict) or "device" not in data or "schema" not in data:
            raise ValueError(f"{source} is not a genbatch profile (no 'schema' and 'device'); "
                             "make one with `gen plan --calibrate DIR... --profile-out NAME`")
        if data["schema"] != SCHEMA:
            raise ValueError(f"{source} has profile schema {data['schema']!r}, this genbatch reads {SCHEMA}; "
                             "calibrate again with `gen plan --calibrate DIR...`")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"schema"})
        if unknown:
            raise ValueError(f"{source}: unknown profile fields {', '.join(unknown)}; calibrate again")
        profile = cls(**{key: value for key, value in data.items() if key in known})
        for name in ("gemm_tflops", "gemm_half_rows", "attention_tflops", "layer_overhead_s", "core_sharing"):
            value = getattr(profile, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"{source}: {name} {value!r} must be a non-negative number or null")
        for table in ("bandwidth_gbs", "latency_s"):
            for key, value in getattr(profile, table).items():
                if "/" not in key or not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"{source}: {table}[{key!r}] = {value!r}; keys are LINK/KIND, values numbers >= 0")
        return profile


def profiles_dir() -> str:
    """`$XDG_CONFIG_HOME/genbatch/profiles`, else `~/.config/genbatch/profiles`."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "genbatch", "profiles")


def profile_path(name_or_path: str) -> str:
    """A path as given when it looks like one (a separator or `.json`), else NAME.json in `profiles_dir()`."""
    if os.sep in name_or_path or "/" in name_or_path or name_or_path.endswith(".json"):
        return name_or_path
    return os.path.join(profiles_dir(), f"{name_or_path}.json")


def save_profile(profile: Profile, name_or_path: str) -> str:
    """Write `profile` as JSON (atomically) to the path or the named profile; returns the path."""
    path = profile_path(name_or_path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(profile.to_dict(), handle, indent=1)
        handle.write("\n")
    os.replace(temporary, path)
    return path


def load_profile(name_or_path: str) -> Profile:
    """Read a profile by name or path; ValueError naming the file and the fix."""
    path = profile_path(name_or_path)
    if not os.path.isfile(path):
        raise ValueError(f"no profile {name_or_path!r} (looked for {path}); give a path, or a name under "
                         f"{profiles_dir()} made with `gen plan --calibrate DIR... --profile-out NAME`")
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a genbatch profile ({error}); give a file `gen plan --calibrate` wrote")
    return Profile.from_dict(data, source=path)
