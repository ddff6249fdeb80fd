"""genbatch.slurm: running genbatch from sbatch.

    launch.py    `python -m genbatch.slurm.launch`: torchrun_args() from the Slurm environment, one torchrun
                 per node, worker exit status 75 kept
    sbatch.py    SbatchSpec -> the sbatch script (pure; body in templates/genbatch.sbatch)
    submit.py    the script to `sbatch`
    cli.py       `gen submit`

Reading the Slurm environment is pure and sits lower, in `genbatch.jobs`, because the runner needs it too:
`jobs.slurm_env` (SlurmContext, array_share() for gen run), `jobs.hostlist` (SLURM_JOB_NODELIST -> host
names), `jobs.slurm_step` (`srun gen run ...` without torchrun: the step's tasks as the ranks of one run).

genbatch reads SLURM_* variables and never defines any (srun and sbatch read SLURM_* and SBATCH_* as options).
"""
