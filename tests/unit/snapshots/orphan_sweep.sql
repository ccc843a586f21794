WITH RECURSIVE waiting_keys(queue_id) AS 
(SELECT (SELECT x.queue_id 
FROM app.q_job_executions AS x 
WHERE x.state = 'waiting' AND x.queue_id > %(after)s::VARCHAR ORDER BY x.queue_id 
 LIMIT 1) AS queue_id UNION ALL SELECT (SELECT x.queue_id 
FROM app.q_job_executions AS x 
WHERE x.state = 'waiting' AND x.queue_id > k.queue_id ORDER BY x.queue_id 
 LIMIT 1) AS anon_1 
FROM waiting_keys AS k 
WHERE k.queue_id IS NOT NULL), 
visited AS 
(SELECT waiting_keys.queue_id AS queue_id 
FROM waiting_keys 
WHERE waiting_keys.queue_id IS NOT NULL 
 LIMIT __[POSTCOMPILE_limit]), 
promoted AS 
(UPDATE app.q_job_executions SET state='pending' WHERE app.q_job_executions.id IN (SELECT first_waiting.id 
FROM visited JOIN LATERAL (SELECT w.id AS id, w.execute_at AS execute_at, w.queue_id AS queue_id 
FROM app.q_job_executions AS w 
WHERE w.queue_id = visited.queue_id AND w.state = 'waiting' ORDER BY w.execute_at, w.id 
 LIMIT 1) AS first_waiting ON true 
WHERE NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS a 
WHERE a.queue_id = first_waiting.queue_id AND (a.state = 'pending' OR a.state = 'running') AND (a.execute_at, a.id) < (first_waiting.execute_at, first_waiting.id))) AND (SELECT started.id 
FROM app.q_job_executions AS started 
WHERE started.queue_id = first_waiting.queue_id AND (started.state = 'pending' OR started.state = 'running') AND started.lease_seconds IS NOT NULL ORDER BY started.execute_at, started.id 
 LIMIT 1) IS NULL AND NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS d 
WHERE d.queue_id = first_waiting.queue_id AND d.state = 'done'))) AND app.q_job_executions.state = 'waiting' RETURNING app.q_job_executions.id)
 SELECT (SELECT max(visited.queue_id) AS max_1 
FROM visited) AS last_key, (SELECT count(*) AS count_1 
FROM promoted) AS promoted
