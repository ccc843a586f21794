WITH stale AS 
(SELECT app.q_job_executions.id AS id 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'running' AND app.q_job_executions.alive_at < now() - app.q_job_executions.lease_seconds * interval '1 second' AND app.q_job_executions.id != ALL (%(held)s::BIGINT[]) FOR NO KEY UPDATE SKIP LOCKED)
 UPDATE app.q_job_executions SET state='pending', reclaims=(app.q_job_executions.reclaims + %(reclaims_1)s::INTEGER), worker_id=NULL, alive_at=NULL FROM stale WHERE app.q_job_executions.id = stale.id RETURNING app.q_job_executions.id, app.q_job_executions.task, app.q_job_executions.attempt, app.q_job_executions.reclaims
