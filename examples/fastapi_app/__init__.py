"""A FastAPI app that enqueues in its requests' transactions and runs a worker in-process."""
