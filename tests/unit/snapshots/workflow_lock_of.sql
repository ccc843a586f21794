SELECT app.q_workflow_nodes.job_id, app.q_workflows.cancelled_at IS NOT NULL AS cancelled, app.q_workflow_nodes.state, app.q_workflow_nodes.name, app.q_jobs.status, app.q_workflows.id AS workflow_id 
FROM app.q_workflow_nodes JOIN app.q_workflows ON app.q_workflows.id = app.q_workflow_nodes.workflow_id LEFT OUTER JOIN app.q_jobs ON app.q_jobs.id = app.q_workflow_nodes.job_id 
WHERE app.q_workflow_nodes.job_id = ANY (%(ids)s::BIGINT[]) ORDER BY app.q_workflows.id, app.q_workflow_nodes.job_id FOR SHARE OF q_workflows
