SELECT recent.task, date_trunc(%(date_trunc_1)s::VARCHAR, recent.finished_at) AS minute, count(*) AS finished, min(recent.finished_at) AS oldest 
FROM (SELECT app.q_jobs.task AS task, app.q_jobs.finished_at AS finished_at 
FROM app.q_jobs 
WHERE app.q_jobs.finished_at IS NOT NULL AND app.q_jobs.finished_at >= now() - 3600.0 * interval '1 second' ORDER BY app.q_jobs.finished_at DESC 
 LIMIT 20000) AS recent GROUP BY recent.task, date_trunc(%(date_trunc_1)s::VARCHAR, recent.finished_at) ORDER BY recent.task, minute
