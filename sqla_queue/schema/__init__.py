"""Creating the queue's schema without Alembic, and verifying it at worker start."""
