"""I/O-free logic shared by every face of the queue: payloads, backoff, outcomes."""
