WITH next_due AS 
(SELECT min(work.sqla_queue_job_executions.execute_at) AS at 
FROM work.sqla_queue_job_executions 
WHERE work.sqla_queue_job_executions.state = 'pending' AND work.sqla_queue_job_executions.task = ANY (%(tasks)s::TEXT[]) AND work.sqla_queue_job_executions.execute_at > now()), 
candidates AS 
(SELECT e.id AS id 
FROM work.sqla_queue_job_executions AS e 
WHERE e.state = 'pending' AND e.execute_at <= now() AND e.task = ANY (%(tasks)s::TEXT[]) AND (e.queue_id IS NULL OR NOT (EXISTS (SELECT * 
FROM work.sqla_queue_job_executions AS p 
WHERE p.queue_id = e.queue_id AND (p.execute_at, p.id) < (e.execute_at, e.id)))) ORDER BY e.priority DESC, e.execute_at, e.id 
 LIMIT %(batch)s::INTEGER FOR UPDATE OF e SKIP LOCKED), 
claimed AS 
(UPDATE work.sqla_queue_job_executions SET state='running', attempt=(work.sqla_queue_job_executions.attempt + %(attempt_1)s::INTEGER), worker_id=%(worker)s::UUID, alive_at=now(), lease_seconds=coalesce(CAST(jsonb_extract_path_text(CAST(%(lease_map)s::VARCHAR AS JSONB), work.sqla_queue_job_executions.task) AS DOUBLE PRECISION), %(lease)s) FROM candidates WHERE work.sqla_queue_job_executions.id = candidates.id RETURNING work.sqla_queue_job_executions.id, work.sqla_queue_job_executions.attempt, work.sqla_queue_job_executions.reclaims, work.sqla_queue_job_executions.queue_id)
 SELECT next_due.at AS next_due, claimed.id, claimed.attempt, claimed.reclaims, claimed.queue_id, work.sqla_queue_jobs.task, work.sqla_queue_jobs.payload, work.sqla_queue_jobs.max_attempts 
FROM next_due LEFT OUTER JOIN (claimed JOIN work.sqla_queue_jobs ON work.sqla_queue_jobs.id = claimed.id) ON true
