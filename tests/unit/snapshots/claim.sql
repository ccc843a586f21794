WITH next_due AS 
(SELECT min(app.q_job_executions.execute_at) AS at 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'pending' AND app.q_job_executions.task = ANY (%(tasks)s::TEXT[]) AND app.q_job_executions.execute_at > now()), 
candidates AS 
(SELECT e.id AS id 
FROM app.q_job_executions AS e 
WHERE e.state = 'pending' AND e.execute_at <= now() AND e.task = ANY (%(tasks)s::TEXT[]) AND (e.queue_id IS NULL OR NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS p 
WHERE p.queue_id = e.queue_id AND (p.execute_at, p.id) < (e.execute_at, e.id)))) ORDER BY e.priority DESC, e.execute_at, e.id 
 LIMIT __[POSTCOMPILE_batch] FOR UPDATE OF e SKIP LOCKED), 
claimed AS 
(UPDATE app.q_job_executions SET state='running', attempt=(app.q_job_executions.attempt + %(attempt_1)s::INTEGER), worker_id=%(worker)s::UUID, alive_at=now(), lease_seconds=coalesce(CAST(jsonb_extract_path_text(CAST(%(lease_map)s::VARCHAR AS JSONB), app.q_job_executions.task) AS DOUBLE PRECISION), %(lease)s) FROM candidates WHERE app.q_job_executions.id = candidates.id RETURNING app.q_job_executions.id, app.q_job_executions.attempt, app.q_job_executions.reclaims, app.q_job_executions.queue_id)
 SELECT next_due.at AS next_due, claimed.id, claimed.attempt, claimed.reclaims, claimed.queue_id, app.q_jobs.task, app.q_jobs.payload, app.q_jobs.max_attempts 
FROM next_due LEFT OUTER JOIN (claimed JOIN app.q_jobs ON app.q_jobs.id = claimed.id) ON true
