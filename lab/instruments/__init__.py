"""Measuring instruments for benchmarks and studies: where a served load's CPU time goes (``cpu_share``) and what a
comparison can resolve on a noisy machine (``noise``)."""
