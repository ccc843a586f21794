SELECT app.q_job_executions.id 
FROM app.q_job_executions 
WHERE app.q_job_executions.id = %(job)s::BIGINT FOR UPDATE OF q_job_executions
