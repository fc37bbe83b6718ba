"""Pieces that only policies use: none of them is a policy or registered."""
