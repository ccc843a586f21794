SELECT pg_advisory_xact_lock(hashtextextended(%(key)s::VARCHAR, 0)) AS locked
