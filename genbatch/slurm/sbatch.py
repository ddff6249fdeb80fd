"""The sbatch script genbatch submits, as a pure function of a typed spec.

    script = render_sbatch(SbatchSpec(command=("python", "-m", "genbatch", "run", "m.parquet", "--out", "o"),
                                      python="python", nodes=2, procs_per_node=8, gpus_per_node=8))

The script's body is `templates/genbatch.sbatch` (readable as it runs); only the `#SBATCH` header, the
launcher and worker command lines and a few values are filled in here. Same spec, same text: golden files in
tests/slurm/golden/ hold the expected scripts.
"""

from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass
from importlib import resources

from genbatch.jobs.exit_codes import REQUEUE

_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True, kw_only=True, slots=True)
class SbatchSpec:
    """Everything a genbatch sbatch script depends on."""

    command: tuple[str, ...]
    """The worker command every rank runs, e.g. (python, -m, genbatch, run, MANIFEST, --out, OUT, --dp, 2)."""
    python: str
    """The Python interpreter on the nodes that has genbatch installed (runs genbatch.slurm.launch)."""
    nodes: int = 1
    """Nodes to allocate; one launcher (torchrun) runs on each."""
    procs_per_node: int = 1
    """Worker processes per node: the GPUs per node, or CPU processes for gloo runs."""
    gpus_per_node: int = 0
    """GPUs to request per node (`--gpus-per-node`); 0 requests none (CPU runs with --backend gloo)."""
    cpus_per_task: int | None = None
    """CPUs for each node's launcher and its workers (`--cpus-per-task`); None leaves Slurm's default."""
    time: str | None = None
    """Time limit (`--time`: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS); None: the partition's."""
    partition: str | None = None
    """Partition (`--partition`); None: the cluster's default."""
    account: str | None = None
    """Account to charge (`--account`)."""
    array: int | None = None
    """Run as a job array of this many tasks (`--array=0-(N-1)`); each task runs its share of the manifest."""
    signal_grace_s: int = 120
    """Seconds before the time limit at which Slurm sends USR1 (`--signal=B:USR1@S`); 0 sends none."""
    requeue: bool = True
    """Requeue the job when genbatch exits 75 (checkpointed); also lets Slurm requeue it on preemption."""
    job_name: str = "genbatch"
    """Job name (`--job-name`, `%x` in log names)."""
    log_dir: str = "slurm-logs"
    """Where Slurm writes the job's stdout and stderr (appended to across requeues)."""
    extra_sbatch: tuple[str, ...] = ()
    """More sbatch options, each one `--name=value` or `--flag` (e.g. --qos=low, --exclusive)."""
    setup: tuple[str, ...] = ()
    """Shell lines run before the launch (module load, source a venv, export a variable)."""

    def __post_init__(self) -> None:
        positive = {"nodes": self.nodes, "procs_per_node": self.procs_per_node}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name}={value}: must be at least 1")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node={self.gpus_per_node}: use 0 for no GPUs (CPU runs with --backend gloo)")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise ValueError(f"cpus_per_task={self.cpus_per_task}: must be at least 1, or None for Slurm's default")
        if self.array is not None and self.array < 1:
            raise ValueError(f"array={self.array}: an array needs at least 1 task (or None for no array)")
        if self.signal_grace_s < 0:
            raise ValueError(f"signal_grace_s={self.signal_grace_s}: must be >= 0 (0 sends no signal before the limit)")
        if self.time is not None and not _TIME.match(self.time):
            raise ValueError(f"time={self.time!r}: use minutes, HH:MM:SS or D-HH:MM:SS (e.g. 04:00:00)")
        if not self.command or not self.python:
            raise ValueError("command and python must be given: the worker command and the interpreter that runs it")
        if not _NAME.match(self.job_name):
            raise ValueError(f"job_name={self.job_name!r}: use letters, digits and _.+- only")
        for option in self.extra_sbatch:
            if not option.startswith("--") or "\n" in option or " " in option.split("=", 1)[0]:
                raise ValueError(f"extra sbatch option {option!r}: give one option as --name=value or --flag")
        for line in self.setup:
            if "\n" in line:
                raise ValueError(f"setup line {line!r} holds a newline; give each shell line separately")

    def header(self) -> list[str]:
        """The `#SBATCH` options, in a fixed order."""
        log_name = "%x-%A_%a" if self.array else "%x-%j"
        options = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            *([f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []),
            *([f"--cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []),
            *([f"--time={self.time}"] if self.time else []),
            *([f"--partition={self.partition}"] if self.partition else []),
            *([f"--account={self.account}"] if self.account else []),
            *([f"--array=0-{self.array - 1}"] if self.array else []),
            *([f"--signal=B:USR1@{self.signal_grace_s}"] if self.signal_grace_s else []),
            "--requeue" if self.requeue else "--no-requeue",
            "--open-mode=append",
            f"--output={self.log_dir.rstrip('/')}/{log_name}.out",
            f"--error={self.log_dir.rstrip('/')}/{log_name}.err",
            *self.extra_sbatch,
        ]
        return [f"#SBATCH {shlex.quote(option)}" for option in options]


class _ScriptTemplate(string.Template):
    """`@{name}` placeholders only, so bash's own `$` and `@` pass through untouched."""

    pattern = r"@(?:(?P<escaped>@)|\{(?P<braced>[a-z_][a-z0-9_]*)\}|(?P<named>(?!))|(?P<invalid>(?!)))"


def fold_command(words: list[str], indent: str = "    ", width: int = 110) -> str:
    """A long command line folded with backslashes, never between an option and its value."""
    groups: list[list[str]] = []
    for word in words:
        if word.startswith("--") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    lines = [shlex.join(groups[0])]
    for group in groups[1:]:
        text = shlex.join(group)
        if len(lines[-1]) + 1 + len(text) <= width - len(indent):
            lines[-1] += " " + text
        else:
            lines.append(text)
    return f" \\\n{indent}".join(lines)


def _about(spec: SbatchSpec) -> list[str]:
    """The comment lines that say what happens on a signal, as this spec configured it."""
    if spec.signal_grace_s:
        when = f"Slurm sends USR1 to this shell {spec.signal_grace_s} s before the time limit and at preemption;"
    else:
        when = "Slurm sends no USR1 before the time limit (signal grace 0); on USR1 or TERM to this shell,"
    then = ("and the job requeues itself; its next run resumes where this one stopped." if spec.requeue else
            "and the job ends with status 75 (requeue is off: submit it again to resume).")
    lines = [when, "the trap below passes it to the job step, the workers finish the denoising step,",
             f"checkpoint and exit {REQUEUE}, {then}"]
    if spec.array:
        lines += [f"Each of the {spec.array} array tasks runs its own share of the manifest into the same output",
                  "(gen run reads SLURM_ARRAY_TASK_ID)."]
    return lines


def render_sbatch(spec: SbatchSpec) -> str:
    """The sbatch script for `spec` (pure: same spec, same text)."""
    template = resources.files("genbatch.slurm").joinpath("templates/genbatch.sbatch").read_text()
    about = _about(spec)
    launcher = [spec.python, "-m", "genbatch.slurm.launch", f"--nproc-per-node={spec.procs_per_node}", "--"]
    return _ScriptTemplate(template).substitute(
        header="\n".join(spec.header()),
        command_line=fold_command(list(spec.command), indent="#       "),
        about="\n".join(f"# {line}" for line in about),
        requeue_on_75="1" if spec.requeue else "0",
        setup="".join(f"{line}\n" for line in spec.setup),
        launcher=shlex.join(launcher),
        command=fold_command(list(spec.command)),
        requeue_status=str(REQUEUE),
    )
