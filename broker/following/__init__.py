"""Following a leader: the follower fetchers."""
