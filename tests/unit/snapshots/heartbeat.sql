WITH beat AS 
(INSERT INTO app.q_workers (worker_id, hostname, pid, tasks, concurrency, started_at, seen_at) VALUES (%(worker)s::UUID, %(hostname)s::VARCHAR, %(pid)s::INTEGER, %(tasks)s::TEXT[], %(concurrency)s::INTEGER, now(), clock_timestamp()) ON CONFLICT (worker_id) DO UPDATE SET seen_at = clock_timestamp() RETURNING app.q_workers.worker_id), 
free AS 
(SELECT app.q_job_executions.id AS id 
FROM app.q_job_executions 
WHERE app.q_job_executions.worker_id = %(worker)s::UUID AND coalesce(app.q_job_executions.state, '') = 'running' AND (app.q_job_executions.id, app.q_job_executions.attempt) IN (SELECT unnest(%(ids)s::BIGINT[]) AS unnest_1, unnest(%(attempts)s::INTEGER[]) AS unnest_2) FOR NO KEY UPDATE OF q_job_executions SKIP LOCKED), 
stamped AS 
(UPDATE app.q_job_executions SET alive_at=clock_timestamp() FROM free WHERE app.q_job_executions.id = free.id RETURNING app.q_job_executions.id)
 SELECT app.q_job_executions.id, app.q_job_executions.cancel_requested 
FROM app.q_job_executions 
WHERE app.q_job_executions.worker_id = %(worker)s::UUID AND coalesce(app.q_job_executions.state, '') = 'running' AND (app.q_job_executions.id, app.q_job_executions.attempt) IN (SELECT unnest(%(ids)s::BIGINT[]) AS unnest_1, unnest(%(attempts)s::INTEGER[]) AS unnest_2)
