DELETE FROM app.q_workers WHERE app.q_workers.worker_id = %(worker_id)s::UUID
