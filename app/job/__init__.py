"""What the project adds to the processes of a DDP job that Lightning's launcher, torchrun or SLURM start: their ends
(`children.py`), the network between hosts, the job's store, the meeting, heartbeats, and stop signals and faults on
every rank together."""
