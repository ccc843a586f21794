SELECT app.q_workflow_nodes.job_id 
FROM app.q_workflow_nodes 
WHERE app.q_workflow_nodes.workflow_id = %(wf)s::BIGINT AND app.q_workflow_nodes.state IN ('blocked', 'held') ORDER BY app.q_workflow_nodes.job_id FOR UPDATE OF q_workflow_nodes
