SELECT app.q_workflow_nodes.workflow_id, app.q_workflow_nodes.name, app.q_workflow_nodes.state, CASE WHEN (app.q_workflow_nodes.state = 'held') THEN (SELECT min(app.q_workflow_edges.parent_id) AS min_1 
FROM app.q_workflow_edges 
WHERE app.q_workflow_edges.child_id = app.q_workflow_nodes.job_id AND app.q_workflow_edges.outcome != 'succeeded') END AS failed_parent 
FROM app.q_workflow_nodes 
WHERE app.q_workflow_nodes.job_id = %(job_id)s::BIGINT
