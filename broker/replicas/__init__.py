"""The broker's replicas and their shell: partitions, control requests, carrying out a Ready."""
