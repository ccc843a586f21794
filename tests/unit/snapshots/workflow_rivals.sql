SELECT found.workflow_id, found.rival 
FROM (SELECT app.q_workflows.id AS workflow_id, (SELECT other.id 
FROM app.q_workflows AS other 
WHERE other.name = app.q_workflows.name AND other.about_table = app.q_workflows.about_table AND other.about_key = app.q_workflows.about_key AND other.id != app.q_workflows.id AND other.cancelled_at IS NULL AND (EXISTS (SELECT app.q_workflow_nodes.job_id 
FROM app.q_workflow_nodes JOIN app.q_jobs ON app.q_jobs.id = app.q_workflow_nodes.job_id 
WHERE app.q_workflow_nodes.workflow_id = other.id AND (app.q_workflow_nodes.state IN ('blocked', 'held') OR app.q_jobs.status = 'queued'))) ORDER BY other.id DESC 
 LIMIT %(param_1)s::INTEGER) AS rival 
FROM app.q_workflows 
WHERE app.q_workflows.id = ANY (%(wfs)s::BIGINT[]) AND app.q_workflows.about_key IS NOT NULL) AS found 
WHERE found.rival IS NOT NULL
