SELECT app.q_workflow_nodes.job_id 
FROM app.q_workflow_nodes 
WHERE app.q_workflow_nodes.job_id = ANY (%(ids)s::BIGINT[]) ORDER BY app.q_workflow_nodes.job_id FOR UPDATE OF q_workflow_nodes
