SELECT parent.name, app.q_workflow_edges.outcome, app.q_workflow_edges.result 
FROM app.q_workflow_edges JOIN app.q_workflow_nodes AS parent ON parent.job_id = app.q_workflow_edges.parent_id 
WHERE app.q_workflow_edges.child_id = %(job_id)s::BIGINT ORDER BY app.q_workflow_edges.parent_id
