SELECT pg_advisory_xact_lock_shared(hashtextextended(%(param_1)s::VARCHAR || CAST(%(job)s::BIGINT AS TEXT), 0)) AS locked
