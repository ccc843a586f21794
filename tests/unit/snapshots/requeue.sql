WITH revived AS 
(UPDATE app.q_jobs SET status='queued', attempts=%(param_1)s::INTEGER, finished_at=NULL WHERE app.q_jobs.id = ANY (%(ids)s::BIGINT[]) AND app.q_jobs.status IN ('failed', 'cancelled') RETURNING app.q_jobs.id, app.q_jobs.task, app.q_jobs.priority, app.q_jobs.queue_id, now() AS scheduled_at), 
keys AS 
(SELECT DISTINCT revived.queue_id AS queue_id 
FROM revived 
WHERE revived.queue_id IS NOT NULL), 
ahead AS 
(SELECT keys.queue_id AS queue_id, head.execute_at AS head_at, backlog.execute_at IS NOT NULL AS has_waiting, (SELECT started.id 
FROM app.q_job_executions AS started 
WHERE started.queue_id = keys.queue_id AND (started.state = 'pending' OR started.state = 'running') AND started.lease_seconds IS NOT NULL ORDER BY started.execute_at, started.id 
 LIMIT 1) IS NOT NULL AS started 
FROM keys LEFT OUTER JOIN LATERAL (SELECT h.execute_at AS execute_at 
FROM app.q_job_executions AS h 
WHERE h.queue_id = keys.queue_id AND (h.state = 'pending' OR h.state = 'running') ORDER BY h.execute_at, h.id 
 LIMIT 1 FOR KEY SHARE OF h) AS head ON true LEFT OUTER JOIN LATERAL (SELECT w.execute_at AS execute_at 
FROM app.q_job_executions AS w 
WHERE w.queue_id = keys.queue_id AND w.state = 'waiting' 
 LIMIT 1 FOR KEY SHARE OF w) AS backlog ON true), 
added AS 
(INSERT INTO app.q_job_executions (id, task, priority, queue_id, state, execute_at, workflow) SELECT rows.id AS id, rows.task AS task, rows.priority AS priority, rows.queue_id AS queue_id, rows.anon_1 AS anon_1, rows.scheduled_at AS scheduled_at, EXISTS (SELECT app.q_workflow_nodes.job_id 
FROM app.q_workflow_nodes 
WHERE app.q_workflow_nodes.job_id = rows.id) AS anon_2 
FROM (SELECT ranked.id AS id, ranked.task AS task, ranked.priority AS priority, ranked.queue_id AS queue_id, CASE WHEN (ranked.queue_id IS NULL) THEN 'pending' WHEN (ranked.turn > %(turn_1)s::INTEGER) THEN 'waiting' WHEN ahead.started THEN 'waiting' WHEN (ahead.head_at <= ranked.scheduled_at) THEN 'waiting' WHEN (ahead.head_at IS NULL AND ahead.has_waiting) THEN 'waiting' ELSE 'pending' END AS anon_1, ranked.scheduled_at AS scheduled_at 
FROM (SELECT revived.id AS id, revived.task AS task, revived.priority AS priority, revived.queue_id AS queue_id, revived.scheduled_at AS scheduled_at, row_number() OVER (PARTITION BY revived.queue_id ORDER BY revived.scheduled_at, revived.id) AS turn 
FROM revived) AS ranked LEFT OUTER JOIN ahead ON ahead.queue_id = ranked.queue_id) AS rows ON CONFLICT (id) DO UPDATE SET state = excluded.state, execute_at = excluded.execute_at, attempt = %(param_2)s::INTEGER, worker_id = NULL, alive_at = NULL, lease_seconds = NULL, slot = NULL, cancel_requested = false, workflow = excluded.workflow WHERE app.q_job_executions.state = 'done' RETURNING app.q_job_executions.id)
 SELECT added.id 
FROM added ORDER BY added.id
