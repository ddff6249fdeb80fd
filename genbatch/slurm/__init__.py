"""genbatch.slurm: running genbatch from sbatch.

    env.py       the Slurm environment as a SlurmContext; array_share() for gen run; torchrun_args()
    hostlist.py  SLURM_JOB_NODELIST expressions -> host names
    launch.py    `python -m genbatch.slurm.launch`: one torchrun per node, worker exit status 75 kept
    step.py      `srun gen run ...` without torchrun: the step's tasks as the ranks of one run
    sbatch.py    SbatchSpec -> the sbatch script (pure; body in templates/genbatch.sbatch)
    submit.py    the script to `sbatch`
    cli.py       `gen submit`

genbatch reads SLURM_* variables and never defines any (srun and sbatch read SLURM_* and SBATCH_* as options).
"""
