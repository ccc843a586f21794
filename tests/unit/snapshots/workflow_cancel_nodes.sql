WITH dropped AS 
(UPDATE app.q_workflow_nodes SET state='cancelled' WHERE app.q_workflow_nodes.job_id = ANY (%(ids)s::BIGINT[]) AND app.q_workflow_nodes.state IN ('blocked', 'held') RETURNING app.q_workflow_nodes.job_id), 
ended AS 
(UPDATE app.q_jobs SET status='cancelled', errors=(app.q_jobs.errors || jsonb_build_array(jsonb_build_object(%(param_1)s::VARCHAR, %(param_2)s::VARCHAR, %(param_3)s::VARCHAR, %(param_4)s::VARCHAR, %(param_5)s::VARCHAR, now()))), finished_at=now() FROM dropped WHERE app.q_jobs.id = dropped.job_id AND app.q_jobs.status = 'queued' RETURNING app.q_jobs.id, CASE WHEN app.q_jobs.awaited THEN pg_notify(%(param_6)s::VARCHAR, CAST(app.q_jobs.id AS TEXT)) ELSE NULL END AS notified)
 SELECT ended.id 
FROM ended
