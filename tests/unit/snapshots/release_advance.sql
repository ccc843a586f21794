WITH ended_jobs AS MATERIALIZED 
(SELECT app.q_jobs.id AS id, app.q_jobs.status AS status, CASE WHEN (app.q_jobs.status = 'succeeded') THEN app.q_jobs.result ELSE app.q_jobs.errors -> -1 END AS result 
FROM app.q_jobs 
WHERE app.q_jobs.id = ANY (%(ids)s::BIGINT[]) AND app.q_jobs.status IN ('succeeded', 'failed', 'cancelled')), 
marked AS 
(UPDATE app.q_workflow_edges SET outcome=ended_jobs.status, result=ended_jobs.result FROM ended_jobs WHERE app.q_workflow_edges.parent_id = ended_jobs.id AND app.q_workflow_edges.outcome IS NULL RETURNING app.q_workflow_edges.child_id, app.q_workflow_edges.parent_id, app.q_workflow_edges.outcome), 
touched AS 
(SELECT marked.child_id AS child_id, count(*) FILTER (WHERE marked.outcome = 'succeeded') AS succeeded, count(*) FILTER (WHERE marked.outcome != 'succeeded') AS failed 
FROM marked GROUP BY marked.child_id), 
decided_here AS 
(SELECT app.q_workflow_nodes.job_id AS job_id, CASE WHEN (app.q_workflow_nodes.policy = 'all_finished') THEN CASE WHEN (%(param_1)s::INTEGER = %(param_2)s::INTEGER) THEN 'release' ELSE NULL END WHEN (app.q_workflow_nodes.policy = 'quorum') THEN CASE WHEN (app.q_workflow_nodes.quorum <= touched.succeeded) THEN 'release' WHEN (touched.succeeded + %(param_1)s::INTEGER < app.q_workflow_nodes.quorum) THEN CASE WHEN (app.q_workflow_nodes.on_parent_failure = 'hold') THEN 'hold' ELSE 'cancel' END ELSE NULL END WHEN (touched.failed > %(failed_2)s::INTEGER) THEN CASE WHEN (app.q_workflow_nodes.on_parent_failure = 'hold') THEN 'hold' ELSE 'cancel' END WHEN (%(param_1)s::INTEGER = %(param_3)s::INTEGER) THEN 'release' ELSE NULL END AS verdict 
FROM touched JOIN app.q_workflow_nodes ON app.q_workflow_nodes.job_id = touched.child_id 
WHERE app.q_workflow_nodes.parents = %(parents_1)s::INTEGER AND app.q_workflow_nodes.state IN ('blocked', 'held')), 
released AS 
(UPDATE app.q_workflow_nodes SET state='released' FROM decided_here WHERE app.q_workflow_nodes.job_id = decided_here.job_id AND decided_here.verdict = 'release' AND app.q_workflow_nodes.state IN ('blocked', 'held') RETURNING app.q_workflow_nodes.job_id, app.q_workflow_nodes.delay, app.q_workflow_nodes.run_at), 
ready AS 
(UPDATE app.q_jobs SET scheduled_at=coalesce(released.run_at, now() + coalesce(released.delay, %(coalesce_1)s) * interval '1 second') FROM released WHERE app.q_jobs.id = released.job_id AND app.q_jobs.status = 'queued' RETURNING app.q_jobs.id, app.q_jobs.task, app.q_jobs.priority, app.q_jobs.queue_id, app.q_jobs.scheduled_at), 
keys AS 
(SELECT DISTINCT ready.queue_id AS queue_id 
FROM ready 
WHERE ready.queue_id IS NOT NULL), 
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
written AS 
(INSERT INTO app.q_job_executions (id, task, priority, queue_id, state, execute_at, workflow) SELECT rows.id AS id, rows.task AS task, rows.priority AS priority, rows.queue_id AS queue_id, rows.anon_1 AS anon_1, rows.scheduled_at AS scheduled_at, true AS anon_2 
FROM (SELECT ranked.id AS id, ranked.task AS task, ranked.priority AS priority, ranked.queue_id AS queue_id, CASE WHEN (ranked.queue_id IS NULL) THEN 'pending' WHEN (ranked.turn > %(turn_1)s::INTEGER) THEN 'waiting' WHEN ahead.started THEN 'waiting' WHEN (ahead.head_at <= ranked.scheduled_at) THEN 'waiting' WHEN (ahead.head_at IS NULL AND ahead.has_waiting) THEN 'waiting' ELSE 'pending' END AS anon_1, ranked.scheduled_at AS scheduled_at 
FROM (SELECT ready.id AS id, ready.task AS task, ready.priority AS priority, ready.queue_id AS queue_id, ready.scheduled_at AS scheduled_at, row_number() OVER (PARTITION BY ready.queue_id ORDER BY ready.scheduled_at, ready.id) AS turn 
FROM ready) AS ranked LEFT OUTER JOIN ahead ON ahead.queue_id = ranked.queue_id) AS rows RETURNING app.q_job_executions.id), 
wake AS 
(SELECT pg_notify(%(param_4)s::VARCHAR, %(param_5)s::VARCHAR) AS n), 
dropped AS 
(UPDATE app.q_workflow_nodes SET state='cancelled' FROM decided_here WHERE app.q_workflow_nodes.job_id = decided_here.job_id AND decided_here.verdict = 'cancel' AND app.q_workflow_nodes.state IN ('blocked', 'held') RETURNING app.q_workflow_nodes.job_id), 
ended AS 
(UPDATE app.q_jobs SET status='cancelled', errors=(app.q_jobs.errors || jsonb_build_array(jsonb_build_object(%(param_6)s::VARCHAR, %(param_7)s::VARCHAR, %(param_8)s::VARCHAR, %(param_9)s::VARCHAR, %(param_10)s::VARCHAR, now()))), finished_at=now() FROM dropped WHERE app.q_jobs.id = dropped.job_id AND app.q_jobs.status = 'queued' RETURNING app.q_jobs.id, CASE WHEN app.q_jobs.awaited THEN pg_notify(%(param_11)s::VARCHAR, CAST(app.q_jobs.id AS TEXT)) ELSE NULL END AS notified), 
held AS 
(UPDATE app.q_workflow_nodes SET state='held' FROM decided_here WHERE app.q_workflow_nodes.job_id = decided_here.job_id AND decided_here.verdict = 'hold' AND app.q_workflow_nodes.state = 'blocked' RETURNING app.q_workflow_nodes.job_id)
 SELECT 'candidate' AS verdict, app.q_workflow_nodes.job_id AS id 
FROM touched JOIN app.q_workflow_nodes ON app.q_workflow_nodes.job_id = touched.child_id 
WHERE app.q_workflow_nodes.parents != %(parents_1)s::INTEGER AND app.q_workflow_nodes.state IN ('blocked', 'held') AND (app.q_workflow_nodes.policy = 'quorum' OR app.q_workflow_nodes.policy = 'all_succeeded' AND touched.failed > %(failed_1)s::INTEGER OR (SELECT other.parent_id 
FROM app.q_workflow_edges AS other 
WHERE other.child_id = touched.child_id AND other.outcome IS NULL AND other.parent_id != ALL (%(ids)s::BIGINT[]) AND (other.parent_id NOT IN (SELECT touched.child_id 
FROM touched)) ORDER BY other.parent_id DESC 
 LIMIT 1 FOR SHARE OF other SKIP LOCKED) IS NULL) UNION ALL SELECT 'released', written.id 
FROM written JOIN wake ON true UNION ALL SELECT 'cancelled', ended.id 
FROM ended UNION ALL SELECT 'hold', held.job_id 
FROM held 
WHERE false
