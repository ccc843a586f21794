UPDATE app.q_job_executions SET state='pending', execute_at=now(), wait=NULL FROM (SELECT unnest(%(keys)s::BIGINT[]) AS k) AS keys WHERE app.q_job_executions.state = 'suspended' AND app.q_job_executions.wait = (%(prefix)s::VARCHAR || CAST(CAST(keys.k AS BIGINT) AS TEXT)) AND (EXISTS (SELECT 1 
FROM app.q_jobs 
WHERE app.q_jobs.id = keys.k AND app.q_jobs.status = app.q_jobs.task)) RETURNING app.q_job_executions.id, pg_notify(%(param_1)s::VARCHAR, %(param_2)s::VARCHAR) AS notified
