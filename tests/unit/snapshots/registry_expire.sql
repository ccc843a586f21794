DELETE FROM app.q_workers WHERE app.q_workers.seen_at < now() - %(expire_after)s * interval '1 second' AND app.q_workers.worker_id != %(worker_id)s::UUID
