SELECT recent.task, count(*) AS finished_window, count(*) FILTER (WHERE recent.finished_at >= now() - 60.0 * interval '1 second') AS finished_recent, count(*) FILTER (WHERE recent.status = 'failed') AS failed_window 
FROM (SELECT app.q_jobs.task AS task, app.q_jobs.status AS status, app.q_jobs.finished_at AS finished_at 
FROM app.q_jobs 
WHERE app.q_jobs.finished_at IS NOT NULL AND app.q_jobs.finished_at >= now() - 3600.0 * interval '1 second' ORDER BY app.q_jobs.finished_at DESC 
 LIMIT 100000) AS recent GROUP BY recent.task ORDER BY recent.task
