SELECT failures.task, count(*) AS failed 
FROM (SELECT app.q_jobs.task AS task 
FROM app.q_jobs 
WHERE app.q_jobs.status = 'failed' AND app.q_jobs.finished_at >= now() - 86400.0 * interval '1 second' ORDER BY app.q_jobs.finished_at DESC 
 LIMIT 100000) AS failures GROUP BY failures.task ORDER BY failures.task
