SELECT app.q_job_executions.id, app.q_job_executions.cancel_requested, pg_try_advisory_xact_lock(hashtextextended(%(param_1)s::VARCHAR || CAST(app.q_job_executions.id AS TEXT), 0)) AS no_sender 
FROM app.q_job_executions 
WHERE app.q_job_executions.id = %(job)s::BIGINT AND app.q_job_executions.attempt = %(held_attempt)s::INTEGER AND coalesce(app.q_job_executions.state, '') = 'running' AND app.q_job_executions.worker_id = %(worker)s::UUID FOR UPDATE OF q_job_executions
