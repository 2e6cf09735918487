"""The transaction coordinator (issue 27): see state.py."""
