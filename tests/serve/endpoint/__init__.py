"""Serve tier: one `specserve serve`, started once for every module here (a server start is about a minute)."""
