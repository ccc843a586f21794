SELECT app.q_job_executions.state, app.q_job_executions.attempt, app.q_job_executions.worker_id, app.q_job_executions.cancel_requested 
FROM app.q_job_executions 
WHERE app.q_job_executions.id = %(job)s::BIGINT
