"""genbatch.cluster: what a cluster scheduler tells a process about itself, read from its environment without
importing anything heavy: Slurm's job (`slurm_env`: array shares, node lists, the rendezvous port), its job
steps' tasks as torch.distributed ranks (`slurm_step`), and Slurm's compressed host lists (`hostlist`)."""
