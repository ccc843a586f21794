WITH RECURSIVE levels(task, priority) AS 
(SELECT t.task AS task, (SELECT lv.priority 
FROM work.sqla_queue_job_executions AS lv 
WHERE lv.task = t.task AND lv.state = 'pending' AND lv.slot IS NULL ORDER BY lv.priority DESC 
 LIMIT 1) AS priority 
FROM unnest(%(tasks)s::TEXT[]) AS t(task) UNION ALL SELECT l.task AS task, (SELECT lv.priority 
FROM work.sqla_queue_job_executions AS lv 
WHERE lv.task = l.task AND lv.state = 'pending' AND lv.slot IS NULL AND lv.priority < l.priority ORDER BY lv.priority DESC 
 LIMIT 1) AS anon_1 
FROM levels AS l 
WHERE l.priority IS NOT NULL), 
next_due AS 
(SELECT CASE WHEN (min((SELECT n.execute_at 
FROM work.sqla_queue_job_executions AS n 
WHERE n.task = levels.task AND n.priority = levels.priority AND n.state = 'pending' AND n.slot IS NULL AND n.execute_at > now() ORDER BY n.execute_at 
 LIMIT 1)) > now() + interval '1 day') THEN now() + interval '1 day' ELSE min((SELECT n.execute_at 
FROM work.sqla_queue_job_executions AS n 
WHERE n.task = levels.task AND n.priority = levels.priority AND n.state = 'pending' AND n.slot IS NULL AND n.execute_at > now() ORDER BY n.execute_at 
 LIMIT 1)) END AS at 
FROM levels 
WHERE levels.priority IS NOT NULL), 
candidates AS 
(SELECT both_.id AS id 
FROM (SELECT fresh.id AS id, fresh.task AS task, fresh.priority AS priority, fresh.execute_at AS execute_at, fresh.slot AS slot 
FROM levels JOIN LATERAL (SELECT e.id AS id, e.task AS task, e.priority AS priority, e.execute_at AS execute_at, e.slot AS slot 
FROM work.sqla_queue_job_executions AS e 
WHERE e.task = levels.task AND e.priority = levels.priority AND e.state = 'pending' AND e.slot IS NULL AND e.execute_at <= now() AND (e.queue_id IS NULL OR NOT (EXISTS (SELECT * 
FROM work.sqla_queue_job_executions AS r_key 
WHERE r_key.queue_id = e.queue_id AND r_key.state = 'running')) AND (e.lease_seconds IS NOT NULL OR NOT (EXISTS (SELECT * 
FROM work.sqla_queue_job_executions AS p 
WHERE p.queue_id = e.queue_id AND (p.state = 'pending' OR p.state = 'running') AND (p.execute_at, p.id) < (e.execute_at, e.id))) AND NOT (EXISTS (SELECT * 
FROM work.sqla_queue_job_executions AS w_before 
WHERE w_before.queue_id = e.queue_id AND w_before.state = 'waiting' AND (w_before.execute_at, w_before.id) < (e.execute_at, e.id))) AND (SELECT started.id 
FROM work.sqla_queue_job_executions AS started 
WHERE started.queue_id = e.queue_id AND (started.state = 'pending' OR started.state = 'running') AND started.lease_seconds IS NOT NULL AND started.id != e.id ORDER BY started.execute_at, started.id 
 LIMIT 1) IS NULL)) ORDER BY e.execute_at, e.id 
 LIMIT %(batch)s::INTEGER FOR NO KEY UPDATE OF e SKIP LOCKED) AS fresh ON true UNION ALL SELECT seated.id AS id, seated.task AS task, seated.priority AS priority, seated.execute_at AS execute_at, seated.slot AS slot 
FROM unnest(%(tasks)s::TEXT[]) AS v(task) JOIN LATERAL (SELECT g.id AS id, g.task AS task, g.priority AS priority, g.execute_at AS execute_at, g.slot AS slot 
FROM work.sqla_queue_job_executions AS g 
WHERE g.task = v.task AND g.state = 'pending' AND g.slot IS NOT NULL AND g.execute_at <= now() AND (g.queue_id IS NULL OR NOT (EXISTS (SELECT * 
FROM work.sqla_queue_job_executions AS r_key 
WHERE r_key.queue_id = g.queue_id AND r_key.state = 'running')) AND (g.lease_seconds IS NOT NULL OR NOT (EXISTS (SELECT * 
FROM work.sqla_queue_job_executions AS p 
WHERE p.queue_id = g.queue_id AND (p.state = 'pending' OR p.state = 'running') AND (p.execute_at, p.id) < (g.execute_at, g.id))) AND NOT (EXISTS (SELECT * 
FROM work.sqla_queue_job_executions AS w_before 
WHERE w_before.queue_id = g.queue_id AND w_before.state = 'waiting' AND (w_before.execute_at, w_before.id) < (g.execute_at, g.id))) AND (SELECT started.id 
FROM work.sqla_queue_job_executions AS started 
WHERE started.queue_id = g.queue_id AND (started.state = 'pending' OR started.state = 'running') AND started.lease_seconds IS NOT NULL AND started.id != g.id ORDER BY started.execute_at, started.id 
 LIMIT 1) IS NULL)) ORDER BY g.priority DESC, g.execute_at, g.id 
 LIMIT %(batch)s::INTEGER FOR NO KEY UPDATE OF g SKIP LOCKED) AS seated ON true) AS both_ ORDER BY both_.priority DESC, both_.execute_at, both_.id 
 LIMIT %(batch)s::INTEGER), 
claimed AS 
(UPDATE work.sqla_queue_job_executions SET state='running', attempt=(work.sqla_queue_job_executions.attempt + %(attempt_1)s::INTEGER), worker_id=%(worker)s::UUID, alive_at=now(), lease_seconds=coalesce(CAST(jsonb_extract_path_text(CAST(%(lease_map)s::VARCHAR AS JSONB), work.sqla_queue_job_executions.task) AS DOUBLE PRECISION), %(lease)s) FROM candidates WHERE work.sqla_queue_job_executions.id = candidates.id RETURNING work.sqla_queue_job_executions.id, work.sqla_queue_job_executions.attempt, work.sqla_queue_job_executions.reclaims, work.sqla_queue_job_executions.queue_id, work.sqla_queue_job_executions.task, work.sqla_queue_job_executions.execute_at, work.sqla_queue_job_executions.priority, work.sqla_queue_job_executions.workflow)
 SELECT next_due.at AS next_due, claimed.id, claimed.attempt, claimed.reclaims, claimed.queue_id, claimed.task, work.sqla_queue_jobs.payload, work.sqla_queue_jobs.max_attempts, claimed.execute_at, claimed.priority, claimed.workflow 
FROM next_due LEFT OUTER JOIN (claimed LEFT OUTER JOIN work.sqla_queue_jobs ON work.sqla_queue_jobs.id = claimed.id AND work.sqla_queue_jobs.status = 'queued') ON true
