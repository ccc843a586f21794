SELECT app.q_workers.worker_id, app.q_workers.hostname, app.q_workers.pid, app.q_workers.tasks, app.q_workers.concurrency, app.q_workers.running, app.q_workers.finished, app.q_workers.started_at, app.q_workers.seen_at, EXTRACT(epoch FROM now() - app.q_workers.seen_at) AS seen_seconds_ago 
FROM app.q_workers 
WHERE app.q_workers.seen_at >= now() - %(live_within)s * interval '1 second' ORDER BY app.q_workers.hostname, app.q_workers.pid, app.q_workers.started_at
