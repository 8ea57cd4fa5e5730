"""Scale-out on Ray: batch renders as tasks, worker nodes with call slots (docs/scaling.md)."""
