"""What measures the real stack and checks the planner against it: ``bigtrain probe`` (this machine's matmul rates,
links and tp's per-block cost: ``probe.py``, ``probe_tp.py``) and the simulator (rank 0 of an N-rank job's step on
fake tensors, through the trainer's own build and engine: ``simulate.py``). Above the engine, below the API."""
