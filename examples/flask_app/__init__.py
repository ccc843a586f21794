"""A Flask application that enqueues in its requests' transactions; workers run apart."""
