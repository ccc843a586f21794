WITH new_jobs AS 
(INSERT INTO app.q_jobs (task, payload, priority, queue_id, max_attempts, scheduled_at, unique_key, about_table, about_key) SELECT r.task AS task, r.payload AS payload, r.priority AS priority, r.queue_id AS queue_id, r.max_attempts AS max_attempts, coalesce(r.run_at, now() + coalesce(r.delay, %(coalesce_2)s) * interval '1 second') AS coalesce_1, r.unique_key AS unique_key, r.about_table AS about_table, r.about_key AS about_key 
FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS r(task TEXT, payload JSONB, priority INTEGER, queue_id TEXT, max_attempts INTEGER, run_at TIMESTAMP WITH TIME ZONE, delay DOUBLE PRECISION, seq INTEGER, unique_key TEXT, about_table TEXT, about_key TEXT) ORDER BY r.seq RETURNING app.q_jobs.id, app.q_jobs.task, app.q_jobs.priority, app.q_jobs.queue_id, app.q_jobs.scheduled_at), 
keys AS 
(SELECT DISTINCT new_jobs.queue_id AS queue_id 
FROM new_jobs 
WHERE new_jobs.queue_id IS NOT NULL), 
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
new_executions AS 
(INSERT INTO app.q_job_executions (id, task, priority, queue_id, state, execute_at) SELECT ranked.id AS id, ranked.task AS task, ranked.priority AS priority, ranked.queue_id AS queue_id, CASE WHEN (ranked.queue_id IS NULL) THEN 'pending' WHEN (ranked.turn > %(turn_1)s::INTEGER) THEN 'waiting' WHEN ahead.started THEN 'waiting' WHEN (ahead.head_at <= ranked.scheduled_at) THEN 'waiting' WHEN (ahead.head_at IS NULL AND ahead.has_waiting) THEN 'waiting' ELSE 'pending' END AS anon_1, ranked.scheduled_at AS scheduled_at 
FROM (SELECT new_jobs.id AS id, new_jobs.task AS task, new_jobs.priority AS priority, new_jobs.queue_id AS queue_id, new_jobs.scheduled_at AS scheduled_at, row_number() OVER (PARTITION BY new_jobs.queue_id ORDER BY new_jobs.scheduled_at, new_jobs.id) AS turn 
FROM new_jobs) AS ranked LEFT OUTER JOIN ahead ON ahead.queue_id = ranked.queue_id RETURNING app.q_job_executions.id)
 SELECT new_executions.id AS id 
FROM new_executions ORDER BY new_executions.id
