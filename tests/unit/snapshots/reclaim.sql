WITH stale AS 
(SELECT app.q_job_executions.id AS id, app.q_job_executions.cancel_requested AS cancel_requested, app.q_job_executions.queue_id AS queue_id 
FROM app.q_job_executions 
WHERE app.q_job_executions.state = 'running' AND app.q_job_executions.alive_at < now() - app.q_job_executions.lease_seconds * interval '1 second' AND (NOT (EXISTS (SELECT * 
FROM app.q_workers 
WHERE app.q_workers.worker_id = app.q_job_executions.worker_id AND app.q_workers.seen_at >= now() - app.q_job_executions.lease_seconds * interval '1 second')) OR app.q_job_executions.worker_id = %(worker)s::UUID) AND app.q_job_executions.id != ALL (%(held)s::BIGINT[]) FOR NO KEY UPDATE SKIP LOCKED), 
requeued AS 
(UPDATE app.q_job_executions SET state='pending', reclaims=(app.q_job_executions.reclaims + %(reclaims_1)s::INTEGER), worker_id=NULL, alive_at=NULL FROM stale WHERE app.q_job_executions.id = stale.id AND stale.cancel_requested IS false RETURNING app.q_job_executions.id, app.q_job_executions.task, app.q_job_executions.attempt, app.q_job_executions.reclaims), 
dropped AS 
(DELETE FROM app.q_job_executions USING stale WHERE app.q_job_executions.id = stale.id AND stale.cancel_requested AND stale.queue_id IS NULL RETURNING app.q_job_executions.id, app.q_job_executions.attempt, app.q_job_executions.workflow), 
parked AS 
(UPDATE app.q_job_executions SET state='done', worker_id=NULL, alive_at=NULL, slot=NULL FROM stale WHERE app.q_job_executions.id = stale.id AND stale.cancel_requested AND stale.queue_id IS NOT NULL RETURNING app.q_job_executions.id, app.q_job_executions.attempt, app.q_job_executions.workflow), 
cancelled AS 
(UPDATE app.q_jobs SET status='cancelled', attempts=removed.attempt, finished_at=now() FROM (SELECT dropped.id AS id, dropped.attempt AS attempt, dropped.workflow AS workflow 
FROM dropped UNION ALL SELECT parked.id AS id, parked.attempt AS attempt, parked.workflow AS workflow 
FROM parked) AS removed WHERE app.q_jobs.id = removed.id RETURNING app.q_jobs.id, CASE WHEN app.q_jobs.awaited THEN pg_notify(%(param_1)s::VARCHAR, CAST(app.q_jobs.id AS TEXT)) ELSE NULL END AS notified)
 SELECT requeued.id, requeued.task, requeued.attempt, requeued.reclaims, false AS ended_node 
FROM requeued UNION ALL SELECT cancelled.id, NULL AS anon_1, NULL AS anon__1, NULL AS anon__2, true AS anon_2 
FROM cancelled JOIN (SELECT dropped.id AS id, dropped.attempt AS attempt, dropped.workflow AS workflow 
FROM dropped UNION ALL SELECT parked.id AS id, parked.attempt AS attempt, parked.workflow AS workflow 
FROM parked) AS removed ON removed.id = cancelled.id 
WHERE removed.workflow
