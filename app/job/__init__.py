"""The processes of a DDP job: the node's others started first thing (`early_start.py`), the network between hosts,
the job's store, the meeting said aloud, heartbeats, and stop signals and faults on every rank together."""
