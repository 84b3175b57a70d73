"""Starting ranks: spawn local ones, or pick up rank and world from torchrun, srun or mpirun."""
