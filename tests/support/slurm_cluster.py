"""A real Slurm cluster on this machine, for tests: munge, slurmctld and one slurmd per fake node.

    reason = ensure_installed()          # None, or why the cluster cannot exist here (tests skip with it)
    cluster = SlurmCluster.start(tmp)    # two fake nodes n1, n2 on 127.0.0.1, partitions low and high
    job_id = cluster.sbatch(script_path)
    cluster.wait_until(job_id, lambda job: job["JobState"] == "COMPLETED")
    cluster.stop()                       # every daemon by the PID in its pid file, never by name

The settings are the ones measured in shared/notes/slurm-local.md: proctrack/linuxproc and task/none (no
cgroup delegation needed), more CPUs than the machine has through `SlurmdParameters=config_overrides`, fake
GPUs as character devices, preemption by partition priority with REQUEUE and the user signal sent at
preemption time, and a short credential lifetime so a requeued job restarts in about 10 s instead of 2 min.
Clients find the cluster through `SLURM_CONF` in `cluster.env`; jobs inherit it from the submitting shell.
Ports and the first job id are drawn at random so two clusters on one machine (two test sessions) do not
collide, and neither do the rendezvous ports genbatch derives from job ids.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apt import apt_install

NODES = ("n1", "n2")
PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol")


def ensure_installed(timeout_s: float = 600.0) -> str | None:
    """Install Debian's slurm-wlm and munge when missing. Returns None when ready, else why not (a skip reason)."""
    if all(shutil.which(name) for name in DAEMONS):
        return None
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (to install slurm-wlm and munge and to run slurmd)"
    reason = apt_install(PACKAGES, timeout_s)
    if reason:
        return reason
    missing = [name for name in DAEMONS if not shutil.which(name)]
    return f"installed {PACKAGES} but {missing} are still not on PATH" if missing else None


def ensure_hostnames(names: tuple[str, ...] = NODES, hosts_file: str = "/etc/hosts") -> None:
    """Make the fake node names resolve to 127.0.0.1 (torchrun connects to the first node by name)."""
    missing = []
    for name in names:
        try:
            socket.gethostbyname(name)
        except OSError:
            missing.append(name)
    if missing:
        with open(hosts_file, "a") as handle:
            handle.write(f"127.0.0.1 {' '.join(missing)}\n")


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited already
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL: one process, named by its PID."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _pid_alive(pid):
                return
            time.sleep(0.1)


def parse_record(text: str) -> dict[str, str]:
    """`scontrol show job -o` output -> {key: value}. Values are single tokens except a few free-text
    fields (Command, WorkDir, StdOut...) which never contain spaces in these tests."""
    record = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            record[key] = value
    return record


@dataclass
class SlurmCluster:
    """A running local cluster. Build it with `SlurmCluster.start(root)`; stop it with `stop()`."""

    root: Path
    """Everything the cluster writes: config, munge key and socket, state, spool, pid and log files."""
    nodes: tuple[str, ...] = NODES
    """The fake node names (all on 127.0.0.1)."""
    cpus_per_node: int = 4
    """CPUs each fake node claims (more than the machine has; config_overrides allows it)."""
    gpus_per_node: int = 2
    """Fake GPUs per node (character devices), so `--gpus-per-node` can be requested."""
    grace_time_s: int = 20
    """GraceTime of the low partition: how long a preempted job has between USR1 and SIGTERM."""
    pids: dict[str, int] = field(default_factory=dict)
    """Daemon name -> PID, read from the pid files."""

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm clients (sbatch, scontrol...) and the jobs they submit."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    @classmethod
    def start(cls, root: str | os.PathLike, timeout_s: float = 60.0, **settings) -> SlurmCluster:
        cluster = cls(root=Path(root), **settings)
        try:
            cluster._write_files()
            cluster._start_daemons(timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @classmethod
    def attach(cls, root: str | os.PathLike) -> SlurmCluster:
        """The cluster started earlier under `root` (by another process), with its PIDs from the pid files."""
        cluster = cls(root=Path(root))
        files = {"munged": cluster.root / "munge" / "munged.pid", "slurmctld": cluster.root / "run" / "slurmctld.pid"}
        files.update({path.stem: path for path in (cluster.root / "run").glob("slurmd-*.pid")})
        for name, path in files.items():
            if path.exists():
                cluster.pids[name] = int(path.read_text().strip())
        cluster.nodes = tuple(sorted(n.removeprefix("slurmd-") for n in cluster.pids if n.startswith("slurmd-")))
        return cluster

    # -- set-up ---------------------------------------------------------------------------------------
    def _write_files(self) -> None:
        root = self.root
        for sub in ("etc", "munge", "state", "log", "run", "dev", *(f"spool/{name}" for name in self.nodes)):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for path in (root, root / "munge", root / "run"):  # munge's socket directory must be searchable
            path.chmod(0o755)
        key = root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--force", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o600)
        gpu_files = []
        for index in range(self.gpus_per_node):  # gres File= entries must be character devices
            device = root / "dev" / f"gpu{index}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))
            gpu_files.append(str(device))
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        host = socket.gethostname().split(".")[0]
        first_job_id = random.randint(1_000, 900_000)
        gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        node_lines = [
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus_per_node}"
            f"{gres} State=UNKNOWN"
            for name, port in zip(self.nodes, node_ports)
        ]
        nodelist = ",".join(self.nodes)
        self.conf.write_text("\n".join([
            "ClusterName=genbatch-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: a requeued job waits this long before it may start again (120 s by default)
            f"AuthInfo=socket={root}/munge/munge.socket.2,cred_expire=10",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/run/slurmctld.pid",
            f"SlurmdPidFile={root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # no cgroup delegation here; torchrun starts workers in new sessions, which proctrack/pgid loses
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1,sched_interval=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "SlurmctldParameters=preempt_send_user_signal",
            "MinJobAge=300",
            "KillWait=10",
            f"FirstJobId={first_job_id}",
            *node_lines,
            f"PartitionName=low Nodes={nodelist} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
            f"GraceTime={self.grace_time_s} PreemptMode=REQUEUE",
            f"PartitionName=high Nodes={nodelist} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
            "",
        ]))
        gres_lines = [f"NodeName={name} Name=gpu File={file}" for name in self.nodes for file in gpu_files]
        (root / "etc" / "gres.conf").write_text("AutoDetect=off\n" + "\n".join(gres_lines) + "\n")

    def _start_daemons(self, timeout_s: float) -> None:
        root = self.root
        munge = root / "munge"
        subprocess.run([
            "munged", "--force", f"--socket={munge}/munge.socket.2", f"--key-file={munge}/munge.key",
            f"--pid-file={munge}/munged.pid", f"--log-file={root}/log/munged.log", f"--seed-file={munge}/seed",
        ], check=True, capture_output=True)
        self.pids["munged"] = self._read_pid(munge / "munged.pid", timeout_s)
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, capture_output=True, env=self.env)
        self.pids["slurmctld"] = self._read_pid(root / "run" / "slurmctld.pid", timeout_s)
        for name in self.nodes:
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", name], check=True, capture_output=True, env=self.env)
            self.pids[f"slurmd-{name}"] = self._read_pid(root / "run" / f"slurmd-{name}.pid", timeout_s)
        self._wait_idle(timeout_s)

    def _read_pid(self, path: Path, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return int(path.read_text().strip())
            except (OSError, ValueError):
                time.sleep(0.05)
        raise RuntimeError(f"no pid file {path} after {timeout_s} s; see the logs in {self.root / 'log'}")

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        states = ""
        while time.monotonic() < deadline:
            result = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = result.stdout
            idle = {line.split()[0] for line in states.splitlines() if line.split()[1:] == ["idle"]}
            if idle >= set(self.nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle after {timeout_s} s: {states!r}; logs in {self.root / 'log'}")

    # -- use ------------------------------------------------------------------------------------------
    def run(self, *command: str, check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster."""
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> int:
        """Submit (`sbatch --parsable ARGS`) and return the job id."""
        result = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **(env or {})},
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return int(result.stdout.strip().split(";")[0])

    def jobs(self, job_id: int) -> list[dict[str, str]]:
        """`scontrol show job -o ID`: one record per job (an array gives one per task)."""
        result = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        return [parse_record(line) for line in result.stdout.splitlines() if line.strip()]

    def wait_until(self, job_id: int, done: Callable[[list[dict[str, str]]], bool], timeout_s: float = 120.0,
                   poll_s: float = 0.5) -> list[dict[str, str]]:
        """Poll the job's records until `done(records)`; fail with the records and the logs' tails."""
        deadline = time.monotonic() + timeout_s
        records: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            records = self.jobs(job_id)
            if records and done(records):
                return records
            time.sleep(poll_s)
        raise TimeoutError(f"job {job_id} did not reach the wanted state in {timeout_s} s: {records}")

    def wait_finished(self, job_id: int, timeout_s: float = 120.0) -> list[dict[str, str]]:
        """Wait until every record of the job is in a final state (and not pending a requeue)."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
        return self.wait_until(job_id, lambda jobs: all(job["JobState"] in final for job in jobs), timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every daemon log, for failure messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {path.name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemons by PID: nodes, controller, munge."""
        if self.pids.get("slurmctld"):
            self.run("scancel", "--full", "--state=RUNNING", f"--user={os.getuid()}", check=False)
            self.run("scancel", f"--user={os.getuid()}", check=False)
        for name in [n for n in self.pids if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
            pid = self.pids.pop(name, None)
            if pid:
                _stop_pid(pid)
