"""A run: the folder it owns, its checkpoints, its TensorBoard logs and dashboard, its predictions and exports, and how
it continues from a checkpoint (which run, with which settings, on which plan)."""
