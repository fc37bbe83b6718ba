"""Harnesses that drive a real engine for the lab's checks (``replay``: a trace or a closed loop of clients)."""
