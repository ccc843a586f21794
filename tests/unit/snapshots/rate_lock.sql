SELECT app.q_task_controls.task 
FROM app.q_task_controls 
WHERE app.q_task_controls.task = %(rate_task)s::VARCHAR FOR UPDATE OF q_task_controls SKIP LOCKED
