WITH sent AS 
(INSERT INTO app.q_job_signals (job_id, name, payload) SELECT app.q_jobs.id AS id, %(signal)s::VARCHAR AS anon_1, CAST(%(payload)s::VARCHAR AS JSONB) AS anon_2 
FROM app.q_jobs 
WHERE app.q_jobs.id = %(job)s::BIGINT ON CONFLICT (job_id, name) DO NOTHING RETURNING app.q_job_signals.job_id), 
woken AS 
(UPDATE app.q_job_executions SET state='pending', execute_at=now(), wait=NULL WHERE app.q_job_executions.id = (SELECT sent.job_id 
FROM sent) AND coalesce(app.q_job_executions.state, %(coalesce_1)s::VARCHAR) = 'suspended' AND coalesce(app.q_job_executions.wait, %(coalesce_2)s::VARCHAR) = %(waits_for)s::VARCHAR RETURNING app.q_job_executions.id)
 SELECT (SELECT app.q_jobs.status 
FROM app.q_jobs 
WHERE app.q_jobs.id = %(job)s::BIGINT) AS status, EXISTS (SELECT sent.job_id 
FROM sent) AS stored, EXISTS (SELECT woken.id 
FROM woken) AS woken, CASE WHEN (EXISTS (SELECT woken.id 
FROM woken)) THEN pg_notify(%(param_1)s::VARCHAR, %(param_2)s::VARCHAR) ELSE NULL END AS notified
