SELECT app.q_job_executions.id, app.q_job_executions.cancel_requested 
FROM app.q_job_executions 
WHERE app.q_job_executions.id = %(job)s::BIGINT AND app.q_job_executions.attempt = %(held_attempt)s::INTEGER AND coalesce(app.q_job_executions.state, '') = 'running' AND app.q_job_executions.worker_id = %(worker)s::UUID FOR UPDATE OF q_job_executions
