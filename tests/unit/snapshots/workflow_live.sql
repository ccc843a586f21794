SELECT app.q_workflows.id 
FROM app.q_workflows 
WHERE app.q_workflows.about_table = %(about_table)s::VARCHAR AND app.q_workflows.about_key = %(about_key)s::VARCHAR AND app.q_workflows.name = %(name)s::VARCHAR AND app.q_workflows.cancelled_at IS NULL AND (EXISTS (SELECT app.q_workflow_nodes.job_id 
FROM app.q_workflow_nodes JOIN app.q_jobs ON app.q_jobs.id = app.q_workflow_nodes.job_id 
WHERE app.q_workflow_nodes.workflow_id = app.q_workflows.id AND (app.q_workflow_nodes.state IN ('blocked', 'held') OR app.q_jobs.status = 'queued'))) ORDER BY app.q_workflows.id DESC 
 LIMIT %(param_1)s::INTEGER
