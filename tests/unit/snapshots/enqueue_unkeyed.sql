WITH new_jobs AS 
(INSERT INTO app.q_jobs (task, payload, priority, queue_id, max_attempts, scheduled_at, unique_key, about_table, about_key) SELECT r.task AS task, r.payload AS payload, r.priority AS priority, r.queue_id AS queue_id, r.max_attempts AS max_attempts, coalesce(r.run_at, now() + coalesce(r.delay, %(coalesce_2)s) * interval '1 second') AS coalesce_1, r.unique_key AS unique_key, r.about_table AS about_table, r.about_key AS about_key 
FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS r(task TEXT, payload JSONB, priority INTEGER, queue_id TEXT, max_attempts INTEGER, run_at TIMESTAMP WITH TIME ZONE, delay DOUBLE PRECISION, seq INTEGER, unique_key TEXT, about_table TEXT, about_key TEXT) ORDER BY r.seq RETURNING app.q_jobs.id, app.q_jobs.task, app.q_jobs.priority, app.q_jobs.queue_id, app.q_jobs.scheduled_at), 
new_executions AS 
(INSERT INTO app.q_job_executions (id, task, priority, queue_id, state, execute_at) SELECT new_jobs.id AS id, new_jobs.task AS task, new_jobs.priority AS priority, new_jobs.queue_id AS queue_id, 'pending', new_jobs.scheduled_at AS scheduled_at 
FROM new_jobs RETURNING app.q_job_executions.id), 
wake AS 
(SELECT pg_notify(%(param_1)s::VARCHAR, %(param_2)s::VARCHAR) AS n)
 SELECT new_executions.id AS id 
FROM new_executions JOIN wake ON true ORDER BY new_executions.id
