WITH due AS 
(SELECT app.q_job_executions.id AS id 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'suspended' AND app.q_job_executions.execute_at <= now() ORDER BY app.q_job_executions.execute_at 
 LIMIT %(limit)s::INTEGER FOR UPDATE OF q_job_executions SKIP LOCKED), 
woken AS 
(UPDATE app.q_job_executions SET state='pending', execute_at=now(), wait=NULL WHERE app.q_job_executions.id = ANY (array((SELECT due.id 
FROM due))) AND coalesce(app.q_job_executions.state, %(coalesce_1)s::VARCHAR) = 'suspended' RETURNING app.q_job_executions.id)
 SELECT (SELECT count(*) AS count_1 
FROM woken) AS woken, (SELECT EXTRACT(epoch FROM app.q_job_executions.execute_at - now()) AS anon_1 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'suspended' AND app.q_job_executions.execute_at > now() ORDER BY app.q_job_executions.execute_at 
 LIMIT 1) AS next_in, CASE WHEN ((SELECT count(*) AS count_1 
FROM woken) > %(param_1)s::INTEGER) THEN pg_notify(%(param_2)s::VARCHAR, %(param_3)s::VARCHAR) ELSE NULL END AS notified
