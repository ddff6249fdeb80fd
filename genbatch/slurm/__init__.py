"""genbatch.slurm"""
