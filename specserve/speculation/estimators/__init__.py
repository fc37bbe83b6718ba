"""What the policies estimate online from step records: acceptance per draft position, step time, and the
per-bucket correction of the step-time model; plus AdaSpec's SLO-aware efficiency of a step."""
