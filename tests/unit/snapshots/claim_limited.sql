WITH RECURSIVE levels(task, priority) AS 
(SELECT t.task AS task, (SELECT lv.priority 
FROM app.q_job_executions AS lv 
WHERE lv.task = t.task AND lv.state = 'pending' AND lv.slot IS NULL ORDER BY lv.priority DESC 
 LIMIT 1) AS priority 
FROM unnest(%(tasks)s::TEXT[]) AS t(task) UNION ALL SELECT l.task AS task, (SELECT lv.priority 
FROM app.q_job_executions AS lv 
WHERE lv.task = l.task AND lv.state = 'pending' AND lv.slot IS NULL AND lv.priority < l.priority ORDER BY lv.priority DESC 
 LIMIT 1) AS anon_1 
FROM levels AS l 
WHERE l.priority IS NOT NULL), 
next_due AS 
(SELECT CASE WHEN (min((SELECT n.execute_at 
FROM app.q_job_executions AS n 
WHERE n.task = levels.task AND n.priority = levels.priority AND n.state = 'pending' AND n.slot IS NULL AND n.execute_at > now() ORDER BY n.execute_at 
 LIMIT 1)) > now() + interval '1 day') THEN now() + interval '1 day' ELSE min((SELECT n.execute_at 
FROM app.q_job_executions AS n 
WHERE n.task = levels.task AND n.priority = levels.priority AND n.state = 'pending' AND n.slot IS NULL AND n.execute_at > now() ORDER BY n.execute_at 
 LIMIT 1)) END AS at 
FROM levels 
WHERE levels.priority IS NOT NULL), 
room AS MATERIALIZED 
(SELECT base.task AS task, base.lim AS lim, (SELECT count(*) AS count_2 
FROM app.q_job_executions AS r 
WHERE r.task = base.task AND r.state = 'running' AND r.slot IS NULL) AS legacy, (SELECT count(*) AS count_3 
FROM app.q_job_executions AS o 
WHERE o.task = base.task AND o.slot >= base.lim) AS "over" 
FROM (SELECT t.task AS task, coalesce((SELECT app.q_task_limits.concurrency_limit 
FROM app.q_task_limits 
WHERE app.q_task_limits.task = t.task), CAST(jsonb_extract_path_text(CAST(%(limit_map)s::VARCHAR AS JSONB), t.task) AS INTEGER)) AS lim 
FROM unnest(%(tasks)s::TEXT[]) AS t(task)) AS base 
WHERE base.lim IS NOT NULL), 
seats AS MATERIALIZED 
(SELECT room.task AS task, found.seat AS seat, found.k AS k 
FROM room JOIN LATERAL (SELECT walk.seat AS seat, row_number() OVER () - room."over" AS k 
FROM LATERAL (SELECT room.legacy + (generate_series(%(generate_series_1)s::INTEGER, (room.lim - room.legacy) - %(param_1)s::INTEGER) + %(seat_offset)s::INTEGER) %% greatest(room.lim - room.legacy, %(greatest_1)s::INTEGER) AS seat) AS walk 
WHERE (SELECT x.id 
FROM app.q_job_executions AS x 
WHERE x.task = room.task AND x.slot = walk.seat 
 LIMIT %(param_2)s::INTEGER) IS NULL 
 LIMIT __[POSTCOMPILE_batch] + room."over") AS found ON true 
WHERE found.k >= %(k_1)s::INTEGER), 
picked AS 
(SELECT both_.id AS id, both_.task AS task, both_.slot AS slot, both_.k AS k, both_.gated AS gated 
FROM (SELECT numbered.id AS id, numbered.task AS task, numbered.priority AS priority, numbered.execute_at AS execute_at, numbered.slot AS slot, numbered.k AS k, numbered.gated AS gated 
FROM (SELECT fresh.id AS id, fresh.task AS task, fresh.priority AS priority, fresh.execute_at AS execute_at, fresh.slot AS slot, row_number() OVER (PARTITION BY fresh.task ORDER BY fresh.priority DESC, fresh.execute_at, fresh.id) AS k, room.task IS NOT NULL AS gated, (SELECT count(*) AS count_1 
FROM seats 
WHERE seats.task = room.task) AS free 
FROM levels LEFT OUTER JOIN room ON room.task = levels.task JOIN LATERAL (SELECT e.id AS id, e.task AS task, e.priority AS priority, e.execute_at AS execute_at, e.slot AS slot 
FROM app.q_job_executions AS e 
WHERE e.task = levels.task AND e.priority = levels.priority AND e.state = 'pending' AND e.slot IS NULL AND e.execute_at <= now() AND (e.queue_id IS NULL OR NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS r_key 
WHERE r_key.queue_id = e.queue_id AND r_key.state = 'running')) AND (e.lease_seconds IS NOT NULL OR NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS p 
WHERE p.queue_id = e.queue_id AND (p.state = 'pending' OR p.state = 'running') AND (p.execute_at, p.id) < (e.execute_at, e.id))) AND NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS w_before 
WHERE w_before.queue_id = e.queue_id AND w_before.state = 'waiting' AND (w_before.execute_at, w_before.id) < (e.execute_at, e.id))) AND (SELECT started.id 
FROM app.q_job_executions AS started 
WHERE started.queue_id = e.queue_id AND (started.state = 'pending' OR started.state = 'running') AND started.lease_seconds IS NOT NULL AND started.id != e.id ORDER BY started.execute_at, started.id 
 LIMIT 1) IS NULL)) ORDER BY e.execute_at, e.id 
 LIMIT CASE WHEN (room.task IS NULL) THEN __[POSTCOMPILE_batch] ELSE (SELECT count(*) AS count_1 
FROM seats 
WHERE seats.task = room.task) END FOR NO KEY UPDATE OF e SKIP LOCKED) AS fresh ON true) AS numbered 
WHERE NOT numbered.gated OR numbered.k <= numbered.free UNION ALL SELECT seated.id AS id, seated.task AS task, seated.priority AS priority, seated.execute_at AS execute_at, seated.slot AS slot, NULL AS k, false AS gated 
FROM unnest(%(tasks)s::TEXT[]) AS v(task) JOIN LATERAL (SELECT g.id AS id, g.task AS task, g.priority AS priority, g.execute_at AS execute_at, g.slot AS slot 
FROM app.q_job_executions AS g 
WHERE g.task = v.task AND g.state = 'pending' AND g.slot IS NOT NULL AND g.execute_at <= now() AND (g.queue_id IS NULL OR NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS r_key 
WHERE r_key.queue_id = g.queue_id AND r_key.state = 'running')) AND (g.lease_seconds IS NOT NULL OR NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS p 
WHERE p.queue_id = g.queue_id AND (p.state = 'pending' OR p.state = 'running') AND (p.execute_at, p.id) < (g.execute_at, g.id))) AND NOT (EXISTS (SELECT * 
FROM app.q_job_executions AS w_before 
WHERE w_before.queue_id = g.queue_id AND w_before.state = 'waiting' AND (w_before.execute_at, w_before.id) < (g.execute_at, g.id))) AND (SELECT started.id 
FROM app.q_job_executions AS started 
WHERE started.queue_id = g.queue_id AND (started.state = 'pending' OR started.state = 'running') AND started.lease_seconds IS NOT NULL AND started.id != g.id ORDER BY started.execute_at, started.id 
 LIMIT 1) IS NULL)) ORDER BY g.priority DESC, g.execute_at, g.id 
 LIMIT __[POSTCOMPILE_batch] FOR NO KEY UPDATE OF g SKIP LOCKED) AS seated ON true) AS both_ ORDER BY both_.priority DESC, both_.execute_at, both_.id 
 LIMIT __[POSTCOMPILE_batch]), 
assigned AS 
(SELECT picked.id AS id, coalesce(picked.slot, seats.seat) AS slot 
FROM picked LEFT OUTER JOIN seats ON picked.task = seats.task AND seats.k = picked.k AND picked.slot IS NULL 
WHERE coalesce(picked.slot, seats.seat) IS NOT NULL OR NOT picked.gated), 
claimed AS 
(UPDATE app.q_job_executions SET state='running', attempt=(app.q_job_executions.attempt + %(attempt_1)s::INTEGER), worker_id=%(worker)s::UUID, alive_at=now(), lease_seconds=coalesce(CAST(jsonb_extract_path_text(CAST(%(lease_map)s::VARCHAR AS JSONB), app.q_job_executions.task) AS DOUBLE PRECISION), %(lease)s), slot=assigned.slot FROM assigned WHERE app.q_job_executions.id = assigned.id RETURNING app.q_job_executions.id, app.q_job_executions.attempt, app.q_job_executions.reclaims, app.q_job_executions.queue_id, app.q_job_executions.task, app.q_job_executions.execute_at, app.q_job_executions.priority, app.q_job_executions.workflow)
 SELECT next_due.at AS next_due, claimed.id, claimed.attempt, claimed.reclaims, claimed.queue_id, claimed.task, app.q_jobs.payload, app.q_jobs.max_attempts, claimed.execute_at, claimed.priority, claimed.workflow 
FROM next_due LEFT OUTER JOIN (claimed LEFT OUTER JOIN app.q_jobs ON app.q_jobs.id = claimed.id AND app.q_jobs.status = 'queued') ON true
