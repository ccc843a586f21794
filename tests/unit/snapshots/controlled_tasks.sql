SELECT app.q_task_controls.task, app.q_task_controls.paused, app.q_task_controls.rate_max IS NOT NULL AS rated, app.q_task_controls.rate_max, app.q_task_controls.rate_seconds 
FROM app.q_task_controls 
WHERE app.q_task_controls.task = ANY (%(tasks)s::TEXT[]) AND (app.q_task_controls.paused OR app.q_task_controls.rate_max IS NOT NULL)
