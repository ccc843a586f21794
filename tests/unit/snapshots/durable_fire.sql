WITH fired AS 
(SELECT app.q_job_executions.id AS id 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'suspended' AND app.q_job_executions.execute_at < timestamptz '9999-12-31 00:00:00+00' AND (CAST(%(ids)s::BIGINT[] AS BIGINT[]) IS NULL OR app.q_job_executions.id = any(CAST(%(ids)s::BIGINT[] AS BIGINT[])))), 
moved AS 
(UPDATE app.q_job_steps SET result=jsonb_build_object('until', now()) WHERE app.q_job_steps.kind = %(kind_1)s::VARCHAR AND app.q_job_steps.job_id IN (SELECT fired.id 
FROM fired) AND CAST((app.q_job_steps.result ->> %(result_1)s::TEXT) AS TIMESTAMP WITH TIME ZONE) > now() AND (app.q_job_steps.result ->> %(result_2)s::TEXT) IS NULL)
 UPDATE app.q_job_executions SET execute_at=now() WHERE app.q_job_executions.id IN (SELECT fired.id 
FROM fired) RETURNING app.q_job_executions.id
