"""What the group and transaction coordinators share: the shell around a per-partition
state of an internal topic (partitioned.py)."""
