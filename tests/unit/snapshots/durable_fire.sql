WITH moved AS 
(UPDATE app.q_job_steps SET result=jsonb_build_object(%(jsonb_build_object_1)s::VARCHAR, now()) WHERE app.q_job_steps.kind = %(kind_1)s::VARCHAR AND app.q_job_steps.job_id IN (SELECT app.q_job_executions.id 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'suspended' AND (CAST(%(ids)s::BIGINT[] AS BIGINT[]) IS NULL OR app.q_job_executions.id = any(CAST(%(ids)s::BIGINT[] AS BIGINT[])))))
 UPDATE app.q_job_executions SET execute_at=now() WHERE app.q_job_executions.state = 'suspended' AND (CAST(%(ids)s::BIGINT[] AS BIGINT[]) IS NULL OR app.q_job_executions.id = any(CAST(%(ids)s::BIGINT[] AS BIGINT[]))) RETURNING app.q_job_executions.id
