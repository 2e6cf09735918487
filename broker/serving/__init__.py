"""Serving clients and followers: the produce and fetch paths, offsets, waits, producer ids."""
