"""Tidewater broker."""
