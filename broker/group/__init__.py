"""The group coordinator: classic consumer groups and committed offsets (issue 16)."""
