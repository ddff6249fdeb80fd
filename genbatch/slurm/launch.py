"""One node's part of a Slurm job: torchrun with its rendezvous read from the Slurm environment.

    srun --ntasks-per-node=1 python -m genbatch.slurm.launch --nproc-per-node 8 -- gen run MANIFEST --out OUT

runs `torchrun <torchrun_args(ctx, 8)> --no-python gen run MANIFEST --out OUT` on every node and exits with
the status the workers meant. It exists because plain torchrun loses what the sbatch script acts on:

- torchrun turns any worker failure into exit status 1, so `gen run`'s 75 ("checkpointed, requeue me") would
  never reach the script. Here the workers' statuses are kept: 75 if any worker asked for a requeue, else the
  first failure's status (a worker killed by signal N gives 128 + N, as in a shell), else 0.
- torchrun's agent dies on SIGUSR1 (the default action) and answers SIGTERM by killing its workers after a
  timeout, while genbatch's workers need those signals to finish the step and checkpoint. Slurm delivers a
  step's signals to every process of the step, the workers included (measured with proctrack/linuxproc; the
  cgroup plugin does the same), so the agent here runs on a helper thread, where torchrun installs no
  handlers, and the main thread notes USR1/TERM/INT and keeps waiting for the workers to exit.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Iterable, Sequence

from genbatch.jobs.exit_codes import JOBS_FAILED, OK, REQUEUE, USAGE
from genbatch.cluster.slurm_env import SlurmContext, rendezvous_port

HANDLED_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


def torchrun_args(ctx: SlurmContext, nproc_per_node: int, max_restarts: int = 0) -> list[str]:
    """torchrun options for one launcher per node of this job: a c10d rendezvous on the job's first node,
    at a port derived from the job id, with the job id as the rendezvous id."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node}: run at least one process per node (the GPUs per node)")
    return [
        f"--nnodes={ctx.num_nodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={ctx.head_node}:{rendezvous_port(ctx.job_id)}",
        f"--rdzv-id={ctx.job_id}",
        f"--max-restarts={max_restarts}",
    ]


def _not_thread_warning(record: logging.LogRecord) -> bool:
    """Drop torchrun's warning that it cannot install signal handlers off the main thread: that is the point."""
    return not str(record.msg).startswith("Failed to register signal handlers")


def worker_exit_status(exitcodes: Iterable[int]) -> int:
    """The node's exit status from its workers' (torchrun reports signal deaths as negative codes)."""
    failed = [code for code in exitcodes if code != OK]
    if REQUEUE in failed:
        return REQUEUE
    if not failed:
        return OK
    code = failed[0]
    return 128 - code if code < 0 else code


def run_torchrun(argv: Sequence[str]) -> int:
    """Run torchrun in this process with `argv` (its command line after `torchrun`); return the node's status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(list(argv)))
    except ChildFailedError as error:
        ordered = sorted(error.failures.items(), key=lambda item: item[1].timestamp)
        return worker_exit_status(failure.exitcode for _, failure in ordered)
    except Exception:  # rendezvous or launch failure: no worker status to keep
        traceback.print_exc()
        return JOBS_FAILED
    return OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m genbatch.slurm.launch",
        description="Start this node's torchrun workers for a Slurm job (one launcher per node, under srun).",
    )
    parser.add_argument("--nproc-per-node", type=int, required=True, help="worker processes on this node (GPUs)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the worker command, e.g. gen run ...")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("genbatch.slurm.launch: no worker command; give it after --, e.g. -- gen run M --out O", file=sys.stderr)
        return USAGE
    try:
        ctx = SlurmContext.from_environ()
        if ctx is None:
            raise ValueError("SLURM_JOB_ID is not set; start this under srun inside a Slurm job")
        torch_argv = [*torchrun_args(ctx, args.nproc_per_node), "--no-python", *command]
    except ValueError as error:
        print(f"genbatch.slurm.launch: {error}", file=sys.stderr)
        return USAGE
    print(
        f"genbatch.slurm.launch: job {ctx.job_id} node {ctx.node_id}/{ctx.num_nodes} ({ctx.hostnames[ctx.node_id]}) "
        f"restart {ctx.restart_count}: torchrun {shlex.join(torch_argv)}",
        file=sys.stderr, flush=True,
    )

    def note(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        print(f"genbatch.slurm.launch: {name} on node {ctx.node_id}; waiting for the workers", file=sys.stderr,
              flush=True)

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_not_thread_warning)
    status: list[int] = []
    previous = {sig: signal.signal(sig, note) for sig in HANDLED_SIGNALS}
    agent = threading.Thread(target=lambda: status.append(run_torchrun(torch_argv)), name="torchrun-agent",
                             daemon=True)
    try:
        agent.start()
        while agent.is_alive():
            agent.join(0.5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status[0] if status else JOBS_FAILED


if __name__ == "__main__":
    sys.exit(main())
