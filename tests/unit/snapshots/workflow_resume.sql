WITH RECURSIVE down(id) AS 
(SELECT app.q_workflow_edges.child_id AS id 
FROM app.q_workflow_edges 
WHERE app.q_workflow_edges.parent_id = ANY (%(ids)s::BIGINT[]) UNION SELECT app.q_workflow_edges.child_id AS child_id 
FROM app.q_workflow_edges JOIN down ON app.q_workflow_edges.parent_id = down.id JOIN app.q_workflow_nodes ON app.q_workflow_nodes.job_id = down.id 
WHERE app.q_workflow_nodes.state = 'cancelled'), 
reopened AS 
(UPDATE app.q_workflow_nodes SET state='blocked' WHERE app.q_workflow_nodes.job_id IN (SELECT down.id 
FROM down) AND app.q_workflow_nodes.state IN ('blocked', 'held', 'cancelled') RETURNING app.q_workflow_nodes.job_id), 
requeued AS 
(UPDATE app.q_jobs SET status='queued', finished_at=%(param_1)s::TIMESTAMP WITH TIME ZONE FROM reopened WHERE app.q_jobs.id = reopened.job_id AND app.q_jobs.status = 'cancelled' RETURNING app.q_jobs.id), 
cleared AS 
(UPDATE app.q_workflow_edges SET outcome=%(param_2)s::VARCHAR, result=%(param_3)s::JSONB WHERE app.q_workflow_edges.child_id IN (SELECT reopened.job_id 
FROM reopened) AND (app.q_workflow_edges.parent_id = ANY (%(ids)s::BIGINT[]) OR app.q_workflow_edges.parent_id IN (SELECT reopened.job_id 
FROM reopened)) AND app.q_workflow_edges.outcome IS NOT NULL RETURNING app.q_workflow_edges.child_id)
 SELECT reopened.job_id 
FROM reopened
