SELECT app.q_workflow_nodes.workflow_id, app.q_workflow_nodes.name 
FROM app.q_workflow_nodes 
WHERE app.q_workflow_nodes.job_id = %(job_id)s::BIGINT
