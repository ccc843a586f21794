SELECT coalesce(app.q_task_limits.task, app.q_task_controls.task) AS task, app.q_task_limits.concurrency_limit, coalesce(app.q_task_controls.paused, false) AS paused 
FROM app.q_task_limits FULL OUTER JOIN app.q_task_controls ON app.q_task_limits.task = app.q_task_controls.task ORDER BY task
