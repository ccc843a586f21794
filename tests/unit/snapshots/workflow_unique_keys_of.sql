SELECT app.q_workflows.id, app.q_workflows.name, app.q_workflows.about_table, app.q_workflows.about_key 
FROM app.q_workflows 
WHERE app.q_workflows.id = ANY (%(wfs)s::BIGINT[]) AND app.q_workflows.about_key IS NOT NULL AND NOT (app.q_workflows.cancelled_at IS NULL AND (EXISTS (SELECT app.q_workflow_nodes.job_id 
FROM app.q_workflow_nodes JOIN app.q_jobs ON app.q_jobs.id = app.q_workflow_nodes.job_id 
WHERE app.q_workflow_nodes.workflow_id = app.q_workflows.id AND (app.q_workflow_nodes.state IN ('blocked', 'held') OR app.q_jobs.status = 'queued')))) ORDER BY app.q_workflows.id
