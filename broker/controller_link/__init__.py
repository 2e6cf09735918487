"""The broker's link to the controller: registration, heartbeats, AlterPartition."""
