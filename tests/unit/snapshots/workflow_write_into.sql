WITH source AS MATERIALIZED 
(SELECT r.seq AS seq, r.name AS name, r.task AS task, r.payload AS payload, r.priority AS priority, r.queue_id AS queue_id, r.max_attempts AS max_attempts, r.run_at AS run_at, r.delay AS delay, r.after AS after, r.after_jobs AS after_jobs, r.policy AS policy, r.quorum AS quorum, r.on_parent_failure AS on_parent_failure, r.about_table AS about_table, r.about_key AS about_key 
FROM jsonb_to_recordset(CAST(%(nodes)s::VARCHAR AS JSONB)) AS r(seq INTEGER, name TEXT, task TEXT, payload JSONB, priority INTEGER, queue_id TEXT, max_attempts INTEGER, run_at TIMESTAMP WITH TIME ZONE, delay DOUBLE PRECISION, after JSONB, after_jobs JSONB, policy TEXT, quorum INTEGER, on_parent_failure TEXT, about_table TEXT, about_key TEXT)), 
workflow AS 
(SELECT app.q_workflows.id AS id 
FROM app.q_workflows 
WHERE app.q_workflows.id = %(wf)s::BIGINT AND app.q_workflows.cancelled_at IS NULL FOR SHARE OF q_workflows), 
new_jobs AS 
(INSERT INTO app.q_jobs (task, payload, priority, queue_id, max_attempts, scheduled_at, about_table, about_key) SELECT source.task AS task, source.payload AS payload, source.priority AS priority, source.queue_id AS queue_id, source.max_attempts AS max_attempts, CASE WHEN (jsonb_array_length(source.after) + jsonb_array_length(source.after_jobs) = %(param_3)s::INTEGER) THEN coalesce(source.run_at, now() + coalesce(source.delay, %(coalesce_1)s) * interval '1 second') ELSE now() END AS anon_5, source.about_table AS about_table, source.about_key AS about_key 
FROM source 
WHERE EXISTS (SELECT workflow.id 
FROM workflow) ORDER BY source.seq RETURNING app.q_jobs.id, app.q_jobs.task, app.q_jobs.priority, app.q_jobs.queue_id, app.q_jobs.scheduled_at), 
numbered AS 
(SELECT new_jobs.id AS id, row_number() OVER (ORDER BY new_jobs.id) - %(param_2)s::INTEGER AS seq 
FROM new_jobs), 
placed AS 
(SELECT numbered.id AS id, source.seq AS seq, source.name AS name, source.task AS task, source.payload AS payload, source.priority AS priority, source.queue_id AS queue_id, source.max_attempts AS max_attempts, source.run_at AS run_at, source.delay AS delay, source.after AS after, source.after_jobs AS after_jobs, source.policy AS policy, source.quorum AS quorum, source.on_parent_failure AS on_parent_failure, source.about_table AS about_table, source.about_key AS about_key 
FROM source JOIN numbered ON numbered.seq = source.seq), 
new_nodes AS 
(INSERT INTO app.q_workflow_nodes (job_id, workflow_id, name, parents, policy, quorum, on_parent_failure, state, delay, run_at) SELECT placed.id AS id, workflow.id AS id_1, placed.name AS name, jsonb_array_length(placed.after) + jsonb_array_length(placed.after_jobs) AS anon_1, placed.policy AS policy, placed.quorum AS quorum, placed.on_parent_failure AS on_parent_failure, CASE WHEN (jsonb_array_length(placed.after) + jsonb_array_length(placed.after_jobs) = %(param_1)s::INTEGER) THEN 'released' ELSE 'blocked' END AS anon_2, CASE WHEN (jsonb_array_length(placed.after) + jsonb_array_length(placed.after_jobs) = %(param_1)s::INTEGER) THEN NULL ELSE placed.delay END AS anon_3, CASE WHEN (jsonb_array_length(placed.after) + jsonb_array_length(placed.after_jobs) = %(param_1)s::INTEGER) THEN NULL ELSE placed.run_at END AS anon_4 
FROM placed JOIN workflow ON true RETURNING app.q_workflow_nodes.job_id), 
new_edges AS 
(INSERT INTO app.q_workflow_edges (child_id, parent_id) SELECT placed.id AS id, parent.id AS id_2 
FROM placed JOIN jsonb_array_elements_text(placed.after) AS among ON true JOIN numbered AS parent ON parent.seq = CAST(among.value AS BIGINT) UNION ALL SELECT placed.id AS id, CAST(earlier.value AS BIGINT) AS value 
FROM placed JOIN jsonb_array_elements_text(placed.after_jobs) AS earlier ON true RETURNING app.q_workflow_edges.child_id), 
roots AS 
(SELECT new_jobs.id AS id, new_jobs.task AS task, new_jobs.priority AS priority, new_jobs.queue_id AS queue_id, new_jobs.scheduled_at AS scheduled_at 
FROM new_jobs JOIN placed ON placed.id = new_jobs.id 
WHERE jsonb_array_length(placed.after) + jsonb_array_length(placed.after_jobs) = %(param_1)s::INTEGER), 
keys AS 
(SELECT DISTINCT roots.queue_id AS queue_id 
FROM roots 
WHERE roots.queue_id IS NOT NULL), 
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
runs AS 
(INSERT INTO app.q_job_executions (id, task, priority, queue_id, state, execute_at, workflow) SELECT rows.id AS id, rows.task AS task, rows.priority AS priority, rows.queue_id AS queue_id, rows.anon_6 AS anon_6, rows.scheduled_at AS scheduled_at, true AS anon_7 
FROM (SELECT ranked.id AS id, ranked.task AS task, ranked.priority AS priority, ranked.queue_id AS queue_id, CASE WHEN (ranked.queue_id IS NULL) THEN 'pending' WHEN (ranked.turn > %(turn_1)s::INTEGER) THEN 'waiting' WHEN ahead.started THEN 'waiting' WHEN (ahead.head_at <= ranked.scheduled_at) THEN 'waiting' WHEN (ahead.head_at IS NULL AND ahead.has_waiting) THEN 'waiting' ELSE 'pending' END AS anon_6, ranked.scheduled_at AS scheduled_at 
FROM (SELECT roots.id AS id, roots.task AS task, roots.priority AS priority, roots.queue_id AS queue_id, roots.scheduled_at AS scheduled_at, row_number() OVER (PARTITION BY roots.queue_id ORDER BY roots.scheduled_at, roots.id) AS turn 
FROM roots) AS ranked LEFT OUTER JOIN ahead ON ahead.queue_id = ranked.queue_id) AS rows RETURNING app.q_job_executions.id)
 SELECT workflow.id AS workflow_id, numbered.id AS job_id, numbered.seq, CASE WHEN ((SELECT count(*) AS count_1 
FROM runs) > %(param_4)s::INTEGER) THEN pg_notify(%(param_5)s::VARCHAR, %(param_6)s::VARCHAR) ELSE NULL END AS woke 
FROM numbered JOIN workflow ON true ORDER BY numbered.seq
