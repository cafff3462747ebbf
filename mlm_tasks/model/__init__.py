"""What is trained: the masked LMs, their weights in and out, the schedule, FLOPs and MFU (docs/layout.md)."""
