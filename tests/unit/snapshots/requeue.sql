WITH revived AS 
(UPDATE app.q_jobs SET status='queued', attempts=%(param_1)s::INTEGER, finished_at=NULL WHERE app.q_jobs.id = ANY (%(ids)s::BIGINT[]) AND app.q_jobs.status IN ('failed', 'cancelled') RETURNING app.q_jobs.id, app.q_jobs.task, app.q_jobs.priority, app.q_jobs.queue_id), 
added AS 
(INSERT INTO app.q_job_executions (id, task, priority, queue_id, state, execute_at) SELECT revived.id AS id, revived.task AS task, revived.priority AS priority, revived.queue_id AS queue_id, 'pending', now() AS now_1 
FROM revived ON CONFLICT (id) DO UPDATE SET state = 'pending', execute_at = now(), attempt = %(param_2)s::INTEGER, worker_id = NULL, alive_at = NULL, slot = NULL, cancel_requested = false WHERE app.q_job_executions.state = 'done' RETURNING app.q_job_executions.id)
 SELECT added.id 
FROM added ORDER BY added.id
